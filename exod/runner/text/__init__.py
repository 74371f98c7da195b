"""The runner's path for a text model (mlx-lm): load its layers (`load`), join its group, put a
first token through every rank, then serve it alone (continuous batching, or one request at a
time when the model or its options cannot batch: `options`) or in step with its group
(exod.runner.group.lockstep) (`serve`), with the prompt cache's disk tier and warm prompts
(`cache`)."""
