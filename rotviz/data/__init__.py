"""Data: what a model is measured on, read offline with fixed, seeded splits.

- `split`: the `Split` of ready tensors and `load_split`, which reads one from a data reference
  (`digits`, `pystdlib`, `cifar10:DIR`, `imagefolder:DIR`, `text:FILE`, labelled text);
- `inputs`: a batch's inputs (one tensor or named inputs) and what consumers do with them;
- `text`: text read as windows of tokens, rotviz's character vocabulary, the pystdlib corpus;
- `images`: the digits, CIFAR-10 batches and folders of images per class;
- `labelled`: labelled text from the user's files (csv, tsv, jsonl, conll, hf), read the way
  a classifier reads it;
- `tokens`: how a model reads text (its own tokenizer, or the character vocabulary);
- `tasks`: the task a model was trained for, its loss, predictions and metrics;
- `splits`: seeded train / val / test index splits and the label value that does not count;
- `files`: which files reading a data reference opens (no torch: the app's sidebar asks it).
"""
