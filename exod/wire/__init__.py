"""The wire: every typed message that crosses a process boundary, and its codecs.

The frames (`protocol`), the daemon-runner messages (`messages`), the start-up specs (`specs`), the
control socket's requests and status (`control`, `control_status`), the zygote's (`zygote`), a
child's end of its channel (`child_end`) and one question to a child (`ask`). Every process
imports from here; nothing here imports the daemon, the API or the runner.
"""
