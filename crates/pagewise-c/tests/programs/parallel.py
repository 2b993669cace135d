# Threads and forked processes, all allocating at once, with an output that
# depends only on the work done, so that a run under LD_PRELOAD can be
# compared byte for byte with a plain run (PYTHONMALLOC=malloc, so every
# Python object is a malloc).
#
# While the parent forks, it keeps two kinds of threads allocating:
# - 8 threads run an SQLite query over and over on connections of their
#   own: SQLite releases the GIL while it runs, so these threads are inside
#   malloc and free (its sorter's buffers) truly in parallel with the rest;
# - 16 threads of a ThreadPoolExecutor build and drop dicts, lists, strings
#   and bytes (64 tasks whose digests are printed).
# It forks:
# - three ProcessPoolExecutors with the fork start method, 4 workers each,
#   which allocate and return digests;
# - four os.fork() children, each running 4 threads of its own, which send
#   digests back through a pipe.
#
# Children leave through os._exit() (a pool worker always does; a child of
# a threaded parent should), which skips the allocator's exit report: when
# pagewise is preloaded and PAGEWISE_STATS_FILE is set, each child writes
# its process's report itself (pagewise_stats_json), once as it starts
# ("<pid>-start") and again as it ends ("<pid>"), so the test can check
# what it allocated through pagewise.
import concurrent.futures as cf
import ctypes
import hashlib
import multiprocessing
import multiprocessing.util
import os
import sqlite3
import sys
import threading


def write_stats_report(suffix=""):
    path = os.environ.get("PAGEWISE_STATS_FILE")
    if not path:
        return
    try:
        stats_json = ctypes.CDLL(None).pagewise_stats_json
    except AttributeError:  # not preloaded
        return
    stats_json.restype = ctypes.c_size_t
    stats_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    size = stats_json(None, 0) + 4096
    buf = ctypes.create_string_buffer(size)
    stats_json(buf, size)
    with open(path.replace("%p", f"{os.getpid()}{suffix}"), "wb") as f:
        f.write(buf.value + b"\n")


def churn(k, n):
    """Allocation-heavy work whose digest depends only on k and n."""
    h = hashlib.sha256()
    live = {}
    for i in range(n):
        key = f"{k}:{i}"
        live[key] = [i] * (i % 23) + [str(i) * (i % 7)]
        if i % 3 == 0:
            live.pop(f"{k}:{i // 2}", None)
        if i % 1000 == 999:
            blob = bytes(range(256)) * (1 + i % 64)  # up to 16 KB
            h.update(hashlib.sha256(blob).digest())
            text = "".join(sorted(live.keys())[:50])
            h.update(text.encode())
    h.update(str(len(live)).encode())
    h.update(str(sum(len(v) for v in live.values())).encode())
    return h.hexdigest()[:16]


QUERY = """
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000)
SELECT count(*), sum(length(s)), min(s), max(s) FROM
  (SELECT hex(x * 2654435761 % 1000003) || printf('%0*d', x % 50, x) AS s
   FROM c ORDER BY s)
"""
# Connections are never closed: a forked child must not touch SQLite, whose
# mutexes another thread may have held at the fork.
CONNECTIONS = []


def sqlite_until(stop, expected, out):
    db = sqlite3.connect(":memory:", check_same_thread=False)
    CONNECTIONS.append(db)
    runs = bad = 0
    while not stop.is_set() or runs == 0:
        if db.execute(QUERY).fetchone() != expected:
            bad += 1
        runs += 1
    out.append(bad)


def thread_task(k):
    return churn(k, 12000)


def process_start():
    write_stats_report("-start")
    # Run by the worker's _bootstrap as it ends, before its os._exit().
    multiprocessing.util.Finalize(None, write_stats_report, exitpriority=-100)


def process_task(k):
    return churn(1000 + k, 15000)


def forked_child(j, w):
    write_stats_report("-start")
    with cf.ThreadPoolExecutor(max_workers=4) as pool:
        digests = list(pool.map(thread_task, range(500 + 4 * j, 504 + 4 * j)))
    write_stats_report()
    os.write(w, (",".join(digests) + "\n").encode())


def main():
    expected = sqlite3.connect(":memory:").execute(QUERY).fetchone()
    print("sqlite", expected)
    stop = threading.Event()
    bad = []
    queries = [
        threading.Thread(target=sqlite_until, args=(stop, expected, bad))
        for _ in range(8)
    ]
    for t in queries:
        t.start()
    fork = multiprocessing.get_context("fork")
    with cf.ThreadPoolExecutor(max_workers=16) as threads:
        in_threads = [threads.submit(thread_task, k) for k in range(64)]
        for r in range(3):
            with cf.ProcessPoolExecutor(
                max_workers=4, mp_context=fork, initializer=process_start
            ) as procs:
                got = list(procs.map(process_task, range(8 * r, 8 * r + 8)))
            print("process pool", r, " ".join(got))
        children = []
        for j in range(4):
            r, w = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.close(r)
                    forked_child(j, w)
                    code = 0
                finally:
                    os._exit(code)
            os.close(w)
            children.append((pid, r))
        for j, (pid, r) in enumerate(children):
            with os.fdopen(r) as f:
                line = f.read().strip()
            _, status = os.waitpid(pid, 0)
            print("forked child", j, "status", status, line)
        # The query threads ran through every fork.
        alive = sum(t.is_alive() for t in queries)
        stop.set()
        for t in queries:
            t.join()
        print("query threads alive through the forks:", alive, "wrong results:", sum(bad))
        for k, f in enumerate(in_threads):
            print("thread task", k, f.result())


if __name__ == "__main__":
    main()
