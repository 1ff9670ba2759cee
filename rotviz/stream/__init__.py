"""At-size slices (`slices`), until the slice record's module takes them in (the layer-wise
barriers at size are rotviz.measures.layerwise's); everything else at size lives in
rotviz.atsize, and streamed matching in rotviz.match.at_size.
"""
