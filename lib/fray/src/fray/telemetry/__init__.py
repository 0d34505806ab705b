"""What happened, when, and how fast: the events work records (events, event_store), the Chrome-trace timeline
built from them (timeline), progress bars (progress), and transfers counted by path (transfers).

Above fray.host; below the runtime, which records into it."""
