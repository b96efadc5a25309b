"""A relay process for bench/outbox.py: argv config_json prefix url table; prints @@READY."""

from __future__ import annotations

import asyncio
import json
import sys

from istos import Istos


async def main() -> None:
    config, prefix, url, table = json.loads(sys.argv[1]), *sys.argv[2:5]
    app = Istos(zenoh=config, prefix=prefix)
    app.outbox_relay(url, table=table, batch=1000)
    async with app.serving():
        print("@@READY", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
