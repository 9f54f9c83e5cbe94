"""figtank.js from its one source: the classic script derived from the ES module runs in
node as a classic script (``window.Figtank``) and the module imports in node, with the same
API; the derivation refuses a source it would not convert faithfully; the TypeScript
declarations name that API; the three forms are served; and ``GET /ws`` without upgrade
headers (the client's probe) answers a refusal before the missing upgrade.

(The declarations were also checked with ``tsc --noEmit --strict`` over a usage file;
that takes ~25 s of npm here, so the suite compares them with the source instead.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.http.clientjs import classic_script
from gateway.http.console import static_file
from tests.http.helpers import H11Client, http_server

MODULE = static_file("figtank.mjs").decode()
DECLARATIONS = static_file("figtank.d.ts").decode()
#: The class's own API: what neither starts with _ nor is the constructor.
PUBLIC = """
  const proto = Figtank.prototype;
  const names = Object.getOwnPropertyNames(proto)
    .filter((n) => n !== "constructor" && !n.startsWith("_")).sort();
  console.log(JSON.stringify({type: typeof Figtank, names}));
"""


def _node(tmp_path: Path, name: str, source: str) -> dict:
    node = shutil.which("node")
    assert node, "node is needed to run figtank.js outside a browser"
    path = tmp_path / name
    path.write_text(source)
    done = subprocess.run([node, str(path)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_classic_script_and_the_module_have_the_same_api(tmp_path: Path) -> None:
    (tmp_path / "figtank.mjs").write_text(MODULE)
    as_module = _node(tmp_path, "use.mjs", 'import {Figtank} from "./figtank.mjs";\n' + PUBLIC)
    classic = classic_script(MODULE)
    assert "export" not in re.findall(r"^\s*(\w+)", classic, re.MULTILINE)
    # Run as a classic script (vm: no module syntax allowed) with a window of its own:
    # Figtank is defined there and nowhere else.
    as_script = _node(tmp_path, "use.cjs", f"""
const vm = require("vm");
const window = {{}};
const context = vm.createContext({{window}});
vm.runInContext({json.dumps(classic)}, context);
const Figtank = window.Figtank;
if (Object.keys(context).join() !== "window") throw new Error("leaked: " + Object.keys(context));
{PUBLIC}""")
    assert as_module == as_script
    assert as_module["type"] == "function"
    assert as_module["names"] == ["close", "publish", "subscribe", "unsubscribe"]


@pytest.mark.parametrize("source", [
    'import {x} from "./x.mjs";\nexport class Figtank {}\n',
    "export class Figtank {}\nexport const other = 1;\n",
    "class Figtank {}\n",
])
def test_the_derivation_refuses_another_form(source: str) -> None:
    with pytest.raises(ValueError, match="one export"):
        classic_script(source)


def test_the_declarations_name_the_api_of_the_source() -> None:
    declared = re.search(r"export declare class Figtank \{(.*?)\n\}", DECLARATIONS, re.S)
    assert declared
    body = re.sub(r"/\*\*.*?\*/", "", declared.group(1), flags=re.S)
    methods = set(re.findall(r"^\s+(\w+)\(", body, re.M)) - {"constructor"}
    properties = set(re.findall(r"^\s+readonly (\w+):", body, re.M))
    source_methods = set(re.findall(r"^  ([a-z]\w*)\(.*\) \{$", MODULE, re.M))
    assert methods == source_methods - {"constructor"}
    for name in properties:  # the fields it reads as documented
        assert re.search(rf"this\.{name} = ", MODULE), name
    options = re.search(r"export interface FigtankOptions \{(.*?)\n\}", DECLARATIONS, re.S)
    assert options
    declared_options = set(re.findall(r"^  (\w+)\?:", options.group(1), re.M))
    assert declared_options == set(re.findall(r"options\.(\w+)", MODULE.split(
        "constructor(", 1)[1].split("\n  }", 1)[0]))
    states = set(re.findall(r'"(\w+)"', DECLARATIONS.split("export type FigtankState", 1)[1]
                            .split(";", 1)[0]))
    used = set(re.findall(r'(?:_stop|onstate)\("(\w+)"', MODULE)) | {"unavailable",
                                                                     "available"}
    assert states == used


async def test_the_three_forms_are_served_and_the_probe_answers_refusals_first(
        tmp_path: Path) -> None:
    async with http_server(tmp_path) as server:
        client = await H11Client.connect(server.host, server.port)
        status, headers, body = await client.request("GET", "/figtank.mjs")
        assert status == 200 and headers["content-type"].startswith("text/javascript")
        assert body.decode() == MODULE
        status, headers, body = await client.request("GET", "/figtank.js")
        assert status == 200 and headers["content-type"].startswith("text/javascript")
        assert body.decode() == classic_script(MODULE)
        status, headers, body = await client.request("GET", "/figtank.d.ts")
        assert status == 200 and headers["content-type"].startswith("application/typescript")
        assert body.decode() == DECLARATIONS

        # The probe: a foreign origin is 403 (readable by its page), a bad token 401,
        # and only then the missing upgrade 400.
        status, headers, body = await client.request(
            "GET", "/ws", headers=[("origin", "http://elsewhere.example")])
        assert (status, body["error"]) == (403, "origin_not_allowed")
        assert headers["access-control-allow-origin"] == "http://elsewhere.example"
        status, headers, body = await client.request(
            "GET", "/ws", headers=[("authorization", "Bearer not-a-token")])
        assert (status, body["error"]) == (401, "invalid_token")
        assert headers["www-authenticate"].startswith("Bearer")
        status, _, body = await client.request("GET", "/ws")
        assert (status, body["error"]) == (400, "bad_upgrade")
        await client.aclose()
