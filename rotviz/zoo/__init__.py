"""Building the model zoo: small trained models shipped in `rotviz/assets/zoo/` (or built on
demand into the user cache: rotviz.zoo_registry), each rebuildable
from its recipe. `build` trains an entry (with `train`, on `recipes`; the text models' corpora
and tokenizer come from `nlp`), imported only by what builds.

Which models the zoo holds, where they live and their cards is rotviz.zoo_registry, a leaf
below this package: `rotviz.sources.loading` resolves `zoo:NAME` with it.
"""
