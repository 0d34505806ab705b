"""What runs in the driver's process: the Controller of a context and its parts (object directory, worker
process pool, task scheduler, streams, actors, groups, gangs), the coordinator actor that worker processes ask,
its service, and the driver's ControllerClient (client). Nothing here imports fray_monarch.workers: the actor
classes it spawns are found by name (core/actor_classes.py).
"""
