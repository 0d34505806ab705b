"""What runs inside Monarch worker processes: the actor classes fray spawns there (hosts: WorkerHost and
FrayActorHost, with the ports their replies go through), the process's runtime, task runner and job-context
client, and what puts them together (process).
"""
