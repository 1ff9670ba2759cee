"""The symmetries themselves: a model's parameters as a view (`view`), the group actions on
it (`actions`, `residual`) and the registry of every symmetry rotviz knows (`registry`)."""
