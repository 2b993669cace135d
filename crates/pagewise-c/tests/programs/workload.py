# Builds and drops large dicts, lists and strings; prints digests so that a
# run under LD_PRELOAD can be compared byte for byte with a plain run.
import hashlib

digest = hashlib.sha256()
for round in range(4):
    d = {f"key-{round}-{i}": "v" * (i % 200) for i in range(60000)}
    l = [list(range(i % 50)) for i in range(30000)]
    s = "".join(str(i) for i in range(100000))
    big = ("x" * 1000 + str(round)) * 3000  # a 3 MB string
    digest.update(str(len(d)).encode())
    digest.update(str(sum(len(x) for x in l)).encode())
    digest.update(s[-50:].encode())
    digest.update(big[-10:].encode())
    print(round, len(d), sum(map(len, d.values())), len(l), len(s), len(big))
    del d, l, s, big
print(digest.hexdigest())

# Threads allocating, and fork() while they run: the child allocates too.
import os
import threading

results = [None] * 4


def work(k):
    results[k] = sum(len(str(i) * 3) for i in range(40000 + k))


threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    x = {i: str(i) * 2 for i in range(100000)}
    os.write(w, str(sum(map(len, x.values()))).encode())
    os._exit(0)
os.close(w)
child = os.read(r, 100).decode()
os.waitpid(pid, 0)
for t in threads:
    t.join()
print("threads", results, "child", child)
