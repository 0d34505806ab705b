"""Where a context's hosts come from and what outlives a context: launchers and topology, the host worker
(`python -m fray_monarch.worker`), the ClusterContext and its jobs (context), and the recorded cluster of
`fray cluster start` (head, head_client, head_record, persistent).
"""
