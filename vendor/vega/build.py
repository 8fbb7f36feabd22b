"""Build `template.html`, the page `dvc plots show` / `dvc plots diff` fill (`plots.html_template` in
.dvc/config), with Vega, Vega-Lite and vega-embed inlined so the plots draw with no network.

    python vendor/vega/build.py        # needs `npm` and the npm registry; rerun after changing PINNED

Each package is fetched with `npm pack <name>@<version>` (npm checks the tarball's registry
integrity), its UMD build is inlined verbatim into one <script> element, its licence is copied beside
this file, and `vendor.json` records version, npm integrity and the sha256 of each inlined file;
tests/test_sharing.py checks the template against it. DVC fills `{plot_divs}` with one
`vegaEmbed('#id', spec)` call per plot; the template's last script makes those calls draw SVG and
drops the one action that needs the network (open in the Vega editor).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the majors DVC's own page loads from a CDN (dvc-render: vega 5, vega-lite 5, vega-embed 6), newest of each
PINNED = {"vega": "5.33.1", "vega-lite": "5.23.0", "vega-embed": "6.29.0"}
BUILD = {"vega": "package/build/vega.min.js", "vega-lite": "package/build/vega-lite.min.js",
         "vega-embed": "package/build/vega-embed.min.js"}
# the vega tarball carries no licence file: its licence is the vega monorepo's LICENSE (BSD-3-Clause)
VEGA_LICENSE = """Copyright (c) 2015-2023, University of Washington Interactive Data Lab
All rights reserved.

Redistribution and use in source and binary forms, with or without
modification, are permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice, this
   list of conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above copyright notice,
   this list of conditions and the following disclaimer in the documentation
   and/or other materials provided with the distribution.

3. Neither the name of the copyright holder nor the names of its contributors
  may be used to endorse or promote products derived from this software
  without specific prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT OWNER OR CONTRIBUTORS BE LIABLE
FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.
"""
# placeholders dvc-render replaces in the template (a vendored script must not contain them)
PLACEHOLDERS = ("{plot_divs}", "{scripts}", "{refresh_tag}")

HEAD = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
{refresh_tag}
<title>DVC plots</title>
<!-- Built by vendor/vega/build.py: {credits}, inlined from their npm packages (licences:
     vendor/vega/LICENSE.*), so this page draws its plots with no network. -->
<style>
body { font-family: sans-serif; }
table { border-spacing: 15px; }
</style>
"""
SCRIPT = '<script data-package="{name}" data-version="{version}">\n{code}\n</script>\n'
# DVC's plot divs call vegaEmbed('#id', spec): draw SVG, and no action that opens a page on the network
TAIL = """<script>
(function () {
  var embed = window.vegaEmbed;
  window.vegaEmbed = function (el, spec, opts) {
    return embed(el, spec, Object.assign(
      {renderer: "svg", actions: {export: true, source: true, compiled: true, editor: false}}, opts || {}));
  };
})();
</script>
</head>
<body>
{plot_divs}
</body>
</html>
"""


def fetch(name: str, version: str, into: Path) -> tuple[dict, bytes, bytes | None]:
    out = subprocess.run(["npm", "pack", "--json", f"{name}@{version}"], cwd=into, capture_output=True,
                         text=True)
    if out.returncode != 0:
        sys.exit(f"error: npm pack {name}@{version} failed: {out.stderr.strip().splitlines()[-1:]}")
    info = json.loads(out.stdout)[0]
    with tarfile.open(into / info["filename"]) as tar:
        code = tar.extractfile(BUILD[name]).read()
        try:
            licence = tar.extractfile("package/LICENSE").read()
        except KeyError:
            licence = None
    return info, code, licence


def main() -> int:
    parts, record = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, version in PINNED.items():
            info, code, licence = fetch(name, version, Path(tmp))
            text = code.decode("utf-8")
            bad = [p for p in (*PLACEHOLDERS, "</script") if p in text.lower()]
            if bad:
                sys.exit(f"error: {name}@{version}: {BUILD[name]} contains {bad}; it cannot be inlined")
            parts.append(SCRIPT.format(name=name, version=version, code=text.rstrip("\n")))
            (HERE / f"LICENSE.{name}").write_bytes(licence if licence is not None else VEGA_LICENSE.encode())
            record[name] = {"version": version, "file": BUILD[name].removeprefix("package/"),
                            "npm_integrity": info["integrity"], "sha256": hashlib.sha256(code).hexdigest(),
                            "license": f"LICENSE.{name}" + ("" if licence is not None else
                                                            " (from the vega repository: the npm package has none)")}
    credits = ", ".join(f"{n} {v}" for n, v in PINNED.items())
    template = HEAD.replace("{credits}", credits) + "".join(parts) + TAIL
    (HERE / "template.html").write_text(template, encoding="utf-8")
    (HERE / "vendor.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {HERE / 'template.html'} ({len(template.encode()) / 2**20:.1f} MiB): {credits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
