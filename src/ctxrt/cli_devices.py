"""`ctxrt devices`: the backends and OpenCL devices of this machine (`--backend opencl:N` picks device N)."""

from __future__ import annotations

import argparse
import json


def cmd_devices(args: argparse.Namespace) -> int:
    from ctxrt.backends import list_devices
    from ctxrt.backends.opencl.device import INSTALL_HINT

    devices = list_devices()
    if args.json:
        print(json.dumps({"devices": devices}))
        return 0
    for d in devices:
        mem = f"{d['global_memory'] / 2 ** 30:.1f} GiB" if d["global_memory"] else "? GiB"
        if "type" in d:  # an OpenCL device
            shared = ", memory shared with the host" if d["unified_memory"] else ""
            about = f"{d['vendor']}, {d['type']}, driver {d['driver']}"
        else:
            shared, about = "", f"{d['driver']}; kernels: {d['provider']}"
        print(f"{d['backend']:<10} {d['name']} ({about}): {d['compute_units']} compute units, {mem}{shared}")
    if not any("type" in d for d in devices):
        print(f"no OpenCL device: {INSTALL_HINT}")
    return 0
