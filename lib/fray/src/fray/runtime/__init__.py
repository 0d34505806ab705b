"""What backends run on: values and their serialization (serialization, pool, cuda_values, device_shares),
refs and outcomes (refs, outcome, completion, streams, receive), a call's resources and options (resources,
options, arguments), GPUs (gpus), groups and gangs (groups, gang, rendezvous), errors from remote code
(remote_errors), the hooks a backend implements (hooks, capabilities), and its workers' output and environment
(worker_output, worker_env).

Backend writers read these through `fray.backend`. This room imports neither the jobs room nor the API."""
