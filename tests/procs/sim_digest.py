"""Print the sha256 of a fixed scenario's events CSV (determinism across processes)."""

import hashlib
import sys

sys.path.insert(0, sys.argv[1])
from sim_scenarios import faulty_scenario  # noqa: E402

result = faulty_scenario(int(sys.argv[2])).run(until=400.0)
print(hashlib.sha256(result.events.to_csv(index=False).encode()).hexdigest())
