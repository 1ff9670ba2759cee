"""What happened: loss landscapes along paths and planes (`landscape`), merging (`fusion`),
ablations of the matching options (`ablations`) and per-layer SVD spectra (`spectra`)."""
