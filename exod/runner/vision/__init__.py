"""The vision runner: models that see, served through mlx-vlm (the optional extra
`exod[vision]`), behind the same serving loop as the text runner (exod.runner.serving.loop).

`serve` is the path the runner takes for such a model (the spec's kind `vision` says so);
`images` decodes and checks a request's pictures; `prompt` turns a request into token ids and the
processor's pixels; `features` caches what the vision tower made of the same pictures; `engine`
batches requests with and without pictures in mlx-vlm's BatchGenerator. Only this package imports
mlx-vlm (tests/unit/test_import_hygiene.py); importing the package itself imports nothing heavy.
The design: docs/design/vision.md.
"""
