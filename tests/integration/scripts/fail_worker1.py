"""Worker 1 prints a numbered log, then exits 3; every other worker sleeps
(longer than the test may take) and says so if it ever wakes up."""
import sys
import time

from _common import INDEX, write_pid

write_pid()
if INDEX == 1:
    for i in range(100):
        print(f"step {i}")
    time.sleep(0.5)
    print("worker 1 giving up")
    sys.exit(3)
print(f"worker {INDEX} sleeping")
time.sleep(300)
print(f"worker {INDEX} woke up")
