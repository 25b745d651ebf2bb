"""See where the memory went: log a run, draw it with `mrkit plot`, measure a resource with
`mrkit bench --json` and read the numbers back (the simulator unless a GPU is present)."""
import contextlib
import io
import json
import tempfile
from pathlib import Path

import mrkit
from mrkit._cli import main as mrkit_command

has_gpu = mrkit.get_driver().name == "cuda"  # else mrkit runs on the simulated device

out = Path(tempfile.mkdtemp())
mr = mrkit.LoggingAdaptor(mrkit.PoolResource(mrkit.DeviceMemoryResource()), out / "mem.csv")
s = mrkit.Stream.create()
live = [mr.allocate((i % 7 + 1) << 20, s) for i in range(50)]
for i, p in enumerate(live):
    mr.deallocate(p, (i % 7 + 1) << 20, s)
mr.close()
s.close()

buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    mrkit_command(["plot", str(out / "mem.csv"), "-o", str(out / "mem.html")])
    mrkit_command(["bench", "--json", "--quiet", "--ops", "2000", "--rounds", "1", "--workload", "pairs"])
text = buf.getvalue()
bench = json.loads(text[text.index("{"):])
page = (out / "mem.html").read_text()
peak = mrkit.format_size(sum((i % 7 + 1) << 20 for i in range(50)))  # every block live at once
assert "data:image/png;base64," in page and peak in page
us = bench["workloads"]["pairs"]["mrkit pool(device)"]
print(f"plot: {out / 'mem.html'} ({len(page)} bytes), peak {peak}")
print(f"bench on {bench['backend']}: {us:.2f} us per call", *(f"; {k}: {v:.2f}x" for k, v in bench["ratios"]["pairs"].items()))
