"""A rank's group: membership and mx.distributed, the authenticated control connections, the
plan rank 0 sends before each step, lock-step replay of it, and the model whose forward
includes the group's communication.
"""
