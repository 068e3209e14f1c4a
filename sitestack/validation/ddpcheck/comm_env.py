"""The job's own communication settings, judged as the playbook's are at load time: a variable of a family
the stack's library reads (NCCL_, RCCL_, OFI_NCCL_, FI_CXI_) that it does not read, or a setting known to
break its version, is a warning naming the variable (a user may export anything; the playbook's own
settings were refused before they got here). The names and issues come from check-config.json's
``settings``, which the controller writes from sources/comm/ (sitestack/model/comm_settings.py)."""

from __future__ import annotations

import difflib
from typing import Any

#: At most this many warnings are listed (a user's environment could hold thousands of names).
MOST = 20


def setting_warnings(env: dict[str, str], settings: Any) -> list[str]:
    """One line per setting of ``env`` the stack's library does not read (with the nearest name it does) or
    that a known issue names; nothing when ``settings`` is missing or not the controller's shape."""
    if not isinstance(settings, dict) or not isinstance(settings.get("known"), dict):
        return []
    who = str(settings.get("library") or "the stack's NCCL/RCCL")
    known = {str(f): {str(n) for n in names} for f, names in settings["known"].items() if isinstance(names, list)}
    out = []
    for name in sorted(env):
        family = max((f for f in known if name.startswith(f)), key=len, default=None)
        if family is None or name in known[family]:
            continue
        near = difflib.get_close_matches(name, sorted(known[family]), n=1, cutoff=0.8)
        out.append(f"{name}: not a variable {who} reads" + (f"; did you mean {near[0]}?" if near else ""))
    for issue in settings.get("issues") or []:
        if not isinstance(issue, dict):
            continue
        name, values = str(issue.get("variable")), [str(v).upper() for v in issue.get("values") or []]
        if name in env and (not values or env[name].strip().upper() in values):
            out.append(f"{name}={env[name]}: {issue.get('effect')} ({issue.get('source')})")
    return out[:MOST]
