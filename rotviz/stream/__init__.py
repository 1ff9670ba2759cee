"""At-size slices (`slices`) and layer-wise barriers (`layerwise`), until their records'
modules take them in; everything else at size lives in rotviz.atsize, and streamed matching in
rotviz.match.at_size.
"""
