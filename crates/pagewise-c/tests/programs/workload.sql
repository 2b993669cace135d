-- 100k rows: create, fill, index, query.
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, name TEXT, payload BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)
INSERT INTO t SELECT i, (i * 7919) % 1000, 'name-' || i, zeroblob(i % 300) FROM n;
CREATE INDEX t_k ON t(k);
SELECT count(*), sum(k), sum(length(name)), sum(length(payload)) FROM t;
SELECT k, count(*) FROM t WHERE k < 5 GROUP BY k ORDER BY k;
SELECT name FROM t WHERE k = 42 ORDER BY id LIMIT 3;
DELETE FROM t WHERE id % 2 = 0;
SELECT count(*), max(id) FROM t;
SELECT group_concat(name, ';') FROM (SELECT name FROM t ORDER BY k DESC, id LIMIT 5);
