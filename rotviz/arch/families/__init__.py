"""One module per architecture family, found by `rotviz.arch` (pkgutil). Each defines

- `SPEC`: its `ArchSpec` (rotviz.arch.spec);
- `random_config(sizes, **options)`: the config.json of a tiny random test model
  (rotviz.random_models); its keyword-only arguments are the family's options;
- `UNTIED`: the options of a random model whose output head is its own, which residual-stream
  maps need (None where the family has none);
- `ORDER`: where the family is listed.
"""
