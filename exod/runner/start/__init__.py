"""What a runner's start costs, paid once or ahead: the zygote that imports a runner's modules
once and forks each rank (`zygote`), transformers' import table kept on disk between starts
(`import_table`), and what must come before mlx runs anything (`prepare`). Why:
docs/design/runner-start.md."""
