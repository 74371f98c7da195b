"""A rank's group: membership and mx.distributed (`membership`), the authenticated control
connections (`control`), their handshake (`handshake`) and the typed, versioned messages they
carry (`wire`), the plan rank 0 sends before each step (`plan`), lock-step replay of it
(`lockstep`), and the model whose forward includes the group's communication (`group_model`).
"""
