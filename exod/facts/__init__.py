"""What a model's own folder says of it, read without loading it (the daemon and the CLI never
import mlx): its config.json (`model_dir`), what it serves (`embed`), whether it sees (`vision`),
what it can do for a client (`caps`), what Ollama's clients are told of it (`details`), and
whether a layout of it splits (`probe`, asked of the runner's own code in a subprocess).

Apart from exod.config, which is the operator's: the config, the daemon, the API and the runner
all ask these facts, and the facts know nothing of any of them.
"""
