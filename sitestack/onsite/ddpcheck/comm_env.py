"""The job's own communication settings, judged as the playbook's are at load time: a variable of a family
the stack's readers know (NCCL_, RCCL_, OFI_NCCL_, FI_CXI_) that none of them reads, or a setting known to
break the library's version, is a warning naming the variable (a user may export anything; the playbook's
own settings were refused before they got here). The names and issues come from check-config.json's
``settings``, which the controller writes from sources/comm/ (sitestack/model/comm_settings.py)."""

from __future__ import annotations

import difflib
from typing import Any

#: At most this many warnings are listed (a user's environment could hold thousands of names).
MOST = 20


def setting_warnings(env: dict[str, str], settings: Any) -> list[str]:
    """One line per setting of ``env`` no reader of its family reads (with the nearest name one does) or
    that a known issue names; nothing for what ``settings`` holds that is not the controller's shape."""
    if not isinstance(settings, dict) or not isinstance(settings.get("known"), dict):
        return []
    given = settings.get("readers")
    readers: dict[str, Any] = given if isinstance(given, dict) else {}
    known = {str(f): {str(n) for n in names} for f, names in settings["known"].items()
             if isinstance(f, str) and len(f) > 1 and f.endswith("_") and isinstance(names, list)}
    out = []
    for name in sorted(env):
        family = max((f for f in known if name.startswith(f)), key=len, default=None)
        if family is None or name in known[family]:
            continue
        near = difflib.get_close_matches(name, sorted(known[family]), n=1, cutoff=0.8)
        who = readers.get(family) or settings.get("library") or "the stack's NCCL/RCCL"
        out.append(f"{name}: not a variable {who} reads" + (f"; did you mean {near[0]}?" if near else ""))
    return (out + _issues(env, settings.get("issues")))[:MOST]


def _issues(env: dict[str, str], issues: Any) -> list[str]:
    """The known issues (a list of {variable, values, effect, source}) a setting of ``env`` meets."""
    out = []
    for issue in issues if isinstance(issues, list) else []:
        values = issue.get("values") if isinstance(issue, dict) else None
        if not isinstance(values, list):
            continue
        name, wanted = str(issue.get("variable")), {str(v).upper() for v in values}
        if name in env and (not wanted or env[name].strip().upper() in wanted):
            out.append(f"{name}={env[name]}: {issue.get('effect')} ({issue.get('source')})")
    return out
