"""At size: models larger than memory, run and measured from their checkpoint folders with
each block loaded only while it runs (the CLI's --max-memory, the app's "at size").

The machinery, beside the model loaders:
- `runtime`: a model built on the meta device whose blocks load only while they run;
- `blocks`: a checkpoint folder opened at size, one block read as a one-block view, the output
  written as shards as it goes;
- `need`: from the safetensors headers alone, whether a command must run at size;
- `points`: points of parameter space (weighted sums of held models) evaluated block by block.
What is built on it, above matching and the analyses:
- `endpoints`: matched endpoints at size (the matching itself: rotviz.match.at_size,
  rotviz.match.at_size_residual);
- `landscape` (curves and planes), `merge` (merges) and `slices` (slices around one model)
  at size.
The readers these share with the in-memory path stay below: rotviz.sources.checkpoint
(safetensors headers, shards).
"""
