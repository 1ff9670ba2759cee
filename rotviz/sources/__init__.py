"""Where models come from, and how they are read, run and written: the model loaders in one
place. Nothing is imported here, so `rotviz.sources.hf_cache` (the CLI's start) stays light.

- `adapters`: one adapter per weight source (`hf`: transformers' `save_pretrained` folders;
  `timm`), and `call`, the one way rotviz runs a module with a given parameter set;
  `base`, `hf`, `timm` are the adapters themselves, `files` reads weight files for them;
- `loading`: a model reference resolved, its config and weights checked, the model loaded;
- `configs`: a config.json's sizes checked before anything is built from it;
- `pairs`: whether two models can be compared (reading, labels, heads);
- `running`: a loaded model run (probe inputs, attention, twins, output differences);
- `writing`: a state dict saved as a model; `plain`: written without transformers;
- `plain_torch`: the zoo's families loaded and run without importing transformers;
- `checkpoint`: safetensors read lazily; `shards`: written as a stream of shards;
- `hf_cache`: models already in the local Hugging Face cache (`ORG/NAME[@REVISION]`);
- `legacy`: tensors an older version of a model's class kept that today's does not.
"""
