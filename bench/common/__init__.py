"""What the benches measure with: request bodies sent at once, answers read with their first
byte's time, percentiles, CPU seconds, processes and ports (`measure.py`); wrk's report read
into numbers (`wrk_report.py`); nginx's proxy config (`nginx-proxy.conf`)."""
