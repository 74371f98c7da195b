"""The embedding runner: embedding models (inputs into vectors) and cross-encoder rerankers (a
query and its documents into relevance scores), served through mlx-vlm's encoder models (the
optional extra `exod[vision]`), behind the same serve loop as text (exod.runner.serving.loop).

`serve` is the path the runner takes for such a model (the spec's kind `embed` says so);
`load` loads it layer by layer; `inputs` tokenizes a request (off the serve loop) and applies the
length rule; `encoder` runs a padded batch and pools, normalizes and cuts the vectors as the
model's files say; `engine` batches the inputs of every request in flight. Only this package
(and exod.runner.vision) imports mlx-vlm; importing the package imports nothing heavy. The
design: docs/embeddings.md.
"""
