"""What fray needs of the machine it runs on: processes and their identity (procfs), children that die with
their owner (watchdog), addresses (net), Ctrl-C (interrupts), and the state directory (state_dir).

The lowest room: it imports nothing of fray but `fray.errors` and `fray.types`."""
