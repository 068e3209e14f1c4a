"""The ``modules-available`` action: every site module that every stack of the playbook needs loads.

A playbook's stacks (its own and each of ``stacks:``) need site modules in two places: the facts'
``modules.load`` (what builds and runs the stack, in order) and the ``requires`` of the stack's
``modulefiles`` step (what the stack's module loads for its users; by default the base Python's
module). Each list is loaded in order in a shell of its own, as a build or a user's ``module load``
starts from the site's environment; every module that does not load is named, with each stack that
needs it and the key that names it, so one run lists all that is missing (a missing ``rocm/7.1.1``
of a further stack is found before its build, not by its users).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sitestack.actions.action import Action
from sitestack.core.errors import CannotProbe, SitestackError
from sitestack.core.host import Completed, Host
from sitestack.core.probecache import cached_probe
from sitestack.core.quoting import sh
from sitestack.installs.modulefile_specs import default_requires
from sitestack.installs.site_stack import site_stack
from sitestack.model.context import RunContext
from sitestack.model.siteenv import ENV_REPORT, LOAD_FAILED, NO_MODULE_SYSTEM, env_vouchers, prelude


@dataclass(frozen=True)
class ModuleList:
    """Site modules one stack needs, loaded in this order in one shell."""

    stack: str                  # who needs them: "stack rocm7 (pytorch/2.10.0-rocm7.1)"
    key: str                    # where they are named: "stacks.rocm7 facts.modules.load"
    use: tuple[str, ...]        # facts.modules.use of that stack
    modules: tuple[str, ...]


def _stack_label(key: str | None, ctx: RunContext) -> str:
    stack = site_stack(ctx)
    name = f" ({stack.name})" if stack else ""
    return f"stack {key}{name}" if key else f"the playbook's stack{name}"


def module_lists(ctx: RunContext) -> list[ModuleList]:
    """Every stack's lists of site modules (the playbook's own first, then ``stacks:`` in their order):
    facts.modules.load, then the ``requires`` of each of its modulefiles steps."""
    own = ctx.site.own or ctx.site
    out: list[ModuleList] = []
    for key in (None, *own.stacks):
        sctx = ctx.for_stack(key)
        label, where = _stack_label(key, sctx), f"stacks.{key} " if key else ""
        mods = sctx.facts.modules
        if mods.load:
            out.append(ModuleList(label, f"{where}facts.modules.load", mods.use, tuple(mods.load)))
        for spec in own.steps:
            if spec.action != "modulefiles" or spec.stack != key:
                continue
            requires = sctx.actions[spec.action].from_spec(spec, sctx).args.requires
            needs = tuple(default_requires(sctx.facts) if requires is None else requires)
            if needs:
                out.append(ModuleList(label, f"step {spec.name!r} requires", mods.use, needs))
    return out


def _script(lists: Sequence[ModuleList]) -> str:
    """One bash script: for each list, a subshell that loads its modules in order and prints
    ``MISSING<TAB>list<TAB>index`` for each that does not load (and then :data:`ENV_REPORT`); exit 1 when
    any did not."""
    lines = ["failed=0"]
    for i, item in enumerate(lists):
        body = [f"module use {sh(path)} || exit {LOAD_FAILED}" for path in item.use]
        body += [f"module load {sh(name)} >/dev/null 2>&1 || {{ printf 'MISSING\\t{i}\\t{j}\\n'; bad=1; }}"
                 for j, name in enumerate(item.modules)]
        lines.append("( bad=0\n" + "\n".join(body) + "\n" + ENV_REPORT + 'exit "$bad" ) || failed=1')
    return "\n".join(lines) + '\nexit "$failed"\n'


def missing_message(lists: Sequence[ModuleList], out: Completed) -> str | None:
    """The modules the probe's ``MISSING`` lines name, each once with every stack that needs it."""
    needed: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        tag, _, rest = line.partition("\t")
        if tag == "MISSING":
            i, j = (int(n) for n in rest.split("\t"))
            item = lists[i]
            needed.setdefault(item.modules[j], []).append(f"{item.stack}: {item.key}")
    if not needed:
        return None
    return "site modules do not load: " + "; ".join(
        f"{module} (needed by {', '.join(dict.fromkeys(who))})" for module, who in needed.items())


class ModulesAvailable(Action):
    """Every site module each stack needs (facts.modules.load, its modulefiles step's requires) loads (an
    assertion)."""

    action = "modules-available"

    asserts = True

    @dataclass(frozen=True)
    class Args:
        pass

    def describe(self) -> str:
        mods = dict.fromkeys(m for item in module_lists(self.ctx) for m in item.modules)
        return f"check that {', '.join(mods)} load" if mods else "check that the module system works"

    def pending(self, host: Host) -> str | None:
        facts = self.ctx.facts
        if facts.modules.system == "none":
            return None
        lists = module_lists(self.ctx)
        argv = ["bash", "-c", prelude(facts, load=False) + _script(lists)]
        # Kept in the probe cache while the module system's init script and the module files it loaded
        # stay the same (sitestack.model.siteenv.env_vouchers); a failed load is never kept.
        out = cached_probe(host, argv, lambda done: env_vouchers(facts, done))
        if out.rc == NO_MODULE_SYSTEM:
            raise CannotProbe(f"{facts.modules.system} not found on {host.name}: {out.stderr.strip()}")
        message = missing_message(lists, out)
        if message:
            raise SitestackError(message)
        if out.rc != 0:
            raise SitestackError(f"site modules do not load: {out.stderr.strip() or f'exit {out.rc}'}")
        return None
