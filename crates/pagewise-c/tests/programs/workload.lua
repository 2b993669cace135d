-- Tables, strings and garbage: output is deterministic.
local total = 0
for round = 1, 5 do
  local t = {}
  for i = 1, 100000 do
    t[i] = { id = i, name = "item" .. i, tags = { i % 7, i % 11 } }
  end
  local parts = {}
  for i = 1, 20000 do parts[#parts + 1] = tostring(i * round) end
  local s = table.concat(parts, ",")
  local sum = 0
  for _, v in ipairs(t) do sum = sum + v.tags[1] + #v.name end
  total = total + sum + #s
  print(round, #t, sum, #s)
  t, parts, s = nil, nil, nil
  collectgarbage()
end
print("total", total)
