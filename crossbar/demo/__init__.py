"""`make demo` and `make smoke`: crossbar in front of two fake llama-servers, two conversations.

    python -m crossbar.demo run    # start the fakes and crossbar, drive them, leave them running
    python -m crossbar.demo smoke  # the same on free ports, check every answer, stop everything
    python -m crossbar.demo stop   # stop what `run` left running (the pids in demo/)

Standard library only: the driver is a separate program that talks to crossbar over HTTP, like
any client, and starts and stops processes; it never runs a reactor.
"""
