"""A kit for backends whose engine only runs calls: subclass `fray.kit.context.KitJobContext` and
override "start this call there" (`_run_task`) and, where needed, "load this value" (`_load`). in_memory is its
first user; examples/process_pool_backend.py runs tasks on a `concurrent.futures.ProcessPoolExecutor` with it."""
