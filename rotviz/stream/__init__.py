"""Models larger than memory, read from their checkpoint folders one block at a time.

`blocks` (a folder opened for streaming, one block read as a view, the output written as
shards, the function check with each block loaded only while it runs), `match` (the per-layer
maps, streamed), `residual` (weight matching streamed, one pass over the blocks per round) and
`sized` (curves, planes and simple merges of a matched pair, each point built block by block),
`slices` (random slices around one model) and `layerwise` (layer-wise barriers), likewise.
The readers these share with the in-memory path stay below: rotviz.sources.checkpoint (safetensors
headers, shards) and rotviz.skeleton (a model run with each block loaded only while it runs).
"""
