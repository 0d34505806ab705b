"""What every process of a monarch context shares: Monarch's actor API as fray types it (monarch_api), the
process-wide runtime setup, the typed messages between driver and workers (protocol), object ids and refs,
calls' arguments, the JobContext with its client protocol, the import path, the environment and temp
directories, and the names of the actor classes the driver spawns on worker processes (actor_classes).
"""
