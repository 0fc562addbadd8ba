"""What one synthetic environment is made of: its domain, entity names, schema and tools.

A domain's default spec is the original suite: two tables and five tools with fixed names. The
diversity knobs (params `envs`) draw each environment's spec from its own random stream: entity
aliases, tool and argument synonyms, a subset of tool templates, distractor tools, extra typed
columns, the amount's column type and distribution, the database size. A spec is written into
env.json only when it differs from the default, so default suites stay byte-identical.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace

from rollwise.types import ToolCall, ToolSpec


def words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


@dataclass(frozen=True)
class Domain:
    owner: str  # entity with a unique name, e.g. customer
    record: str  # entity owned by an owner, e.g. order
    item: str  # the record's distinguishing column, e.g. product
    items: tuple[str, ...]
    statuses: tuple[str, ...]


DOMAINS: dict[str, Domain] = {
    "shop": Domain(
        "customer",
        "order",
        "product",
        words("lamp chair desk sofa mirror rug clock vase shelf bed stool bench"),
        words("pending shipped delivered"),
    ),
    "clinic": Domain(
        "patient",
        "visit",
        "department",
        words(
            "cardiology dental radiology surgery pediatrics neurology oncology dermatology "
            "urology psychiatry"
        ),
        words("booked confirmed completed"),
    ),
    "library": Domain(
        "member",
        "loan",
        "book",
        words(
            "atlas novel poetry history biology chemistry physics cookbook memoir thriller drama "
            "comics"
        ),
        words("active returned overdue"),
    ),
    "travel": Domain(
        "passenger",
        "booking",
        "destination",
        words("rome oslo lima cairo delhi seoul quito dakar perth hanoi vienna lagos"),
        words("reserved paid ticketed"),
    ),
    "garage": Domain(
        "owner",
        "repair",
        "part",
        words("brakes engine tires battery clutch exhaust radiator mirrors wipers lights"),
        words("queued started finished"),
    ),
    "school": Domain(
        "student",
        "enrollment",
        "course",
        words("algebra art music geometry latin economics robotics theater statistics geology"),
        words("applied accepted attending"),
    ),
    # More entity types for diverse suites (not in the default domain list).
    "bank": Domain(
        "holder",
        "transfer",
        "currency",
        words("euro dollar yen pound franc krona rand peso rupee won"),
        words("requested approved settled"),
    ),
    "hotel": Domain(
        "guest",
        "stay",
        "room",
        words("suite attic loft studio cabin penthouse annex tower garden terrace"),
        words("held confirmed checked"),
    ),
    "farm": Domain(
        "grower",
        "shipment",
        "crop",
        words("wheat barley maize oats rye rice soy beans peas lentils"),
        words("planned loaded delivered"),
    ),
}
# Per-environment entity names (`envs.entity_synonyms`): the same world under other words.
ALIASES: dict[str, tuple[str, ...]] = {
    "customer": ("client", "buyer"),
    "order": ("purchase", "sale"),
    "patient": ("person", "subject"),
    "visit": ("appointment", "consult"),
    "member": ("reader", "patron"),
    "loan": ("checkout", "borrowing"),
    "passenger": ("traveler", "flyer"),
    "booking": ("reservation", "trip"),
    "owner": ("driver", "motorist"),
    "repair": ("job", "service"),
    "student": ("pupil", "learner"),
    "enrollment": ("registration", "signup"),
    "holder": ("depositor", "saver"),
    "transfer": ("payment", "remittance"),
    "guest": ("visitor", "lodger"),
    "stay": ("reservation", "night"),
    "grower": ("farmer", "producer"),
    "shipment": ("delivery", "consignment"),
}
NAMES = words(
    "alice bob carol dave erin frank grace heidi ivan judy kevin laura mallory nina oscar peggy "
    "quinn rupert sybil trent ursula victor wendy xavier yvonne zach amber bruno chloe derek "
    "elena fabio gina hugo iris jonas kira leon mona nils olga pablo rosa sven tara umar vera "
    "walter yara zoran aiko bianca cyrus dora emil flora gustav hana igor jade karl lena milo "
    "nora otto petra rafael selma tomas uma viktor wanda ximena yusuf zelda"
)
CITIES = words(
    "paris tokyo berlin madrid london boston denver austin dublin lisbon prague warsaw zurich "
    "geneva munich milan naples porto seville bergen turku riga tallinn vilnius krakow"
)
TIERS = words("gold silver bronze")
CANCELLED = "cancelled"


@dataclass(frozen=True)
class ToolTemplate:
    """A kind of tool; an environment names it `name` with one of `verbs` (the first is the
    default) and its arguments by the environment's key names. `handler` is the runtime's."""

    verbs: tuple[str, ...]
    name: str
    description: str
    args: tuple[str, ...]  # canonical argument names (keys of KEYS)
    handler: str


TOOL_TEMPLATES: dict[str, ToolTemplate] = {
    # lookup by key / by name
    "find": ToolTemplate(
        words("find lookup search"), "{verb}_{owner}", "Look up a {owner} id by name.",
        ("name",), "_find",
    ),
    "get_owner": ToolTemplate(
        words("get fetch read"), "{verb}_{owner}", "Read a {owner} record.", ("owner",),
        "_get_owner",
    ),
    "list": ToolTemplate(
        words("list browse"), "{verb}_{record}s", "List the {record}s of a {owner}.", ("owner",),
        "_list",
    ),
    "get_record": ToolTemplate(
        words("get fetch read"), "{verb}_{record}", "Read one {record}.", ("record",),
        "_get_record",
    ),
    # update
    "cancel": ToolTemplate(
        words("cancel void revoke"), "{verb}_{record}", "Cancel one {record}.", ("record",),
        "_cancel",
    ),
    "update": ToolTemplate(
        words("set mark update"), "{verb}_{record}_status", "Set the status of one {record}.",
        ("record", "status"), "_update",
    ),
    # filtered list, aggregate, multi-hop join
    "filter": ToolTemplate(
        words("filter select"), "{verb}_{record}s",
        "List the {record}s of a {owner} that have a status.", ("owner", "status"), "_filter",
    ),
    "total": ToolTemplate(
        words("total sum"), "{verb}_{record}s",
        "Count and total amount of the {record}s of a {owner}.", ("owner",), "_total",
    ),
    "owner_of": ToolTemplate(
        words("get fetch"), "{verb}_{record}_{owner}", "Read the {owner} who holds a {record}.",
        ("record",), "_owner_of",
    ),
    # distractors: working tools that no task needs
    "count_owners": ToolTemplate(
        words("count tally"), "{verb}_{owner}s", "Count every {owner}.", (), "_count_owners"
    ),
    "list_items": ToolTemplate(
        words("list browse"), "{verb}_{item}s", "List every {item} on record.", (), "_list_items"
    ),
    "in_city": ToolTemplate(
        words("list locate"), "{verb}_{owner}s_in_city", "List the {owner}s living in a city.",
        ("city",), "_in_city",
    ),
}  # fmt: skip
DEFAULT_TOOLS = ("find", "get_owner", "list", "get_record", "cancel")
DISTRACTORS = ("count_owners", "list_items", "in_city")
ENTRY_TOOLS = ("find", "list")  # kept by `envs.tools_per_env`: an owner by name, their records
# Canonical argument -> its names (the first is the default) and JSON type.
KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "name": (words("name full_name"), "string"),
    "owner": (words("{owner}_id {owner}_key {owner}_ref"), "integer"),
    "record": (words("{record}_id {record}_key {record}_ref"), "integer"),
    "status": (words("status state"), "string"),
    "city": (words("city town"), "string"),
}
# Schema templates: extra typed columns (records.priority INTEGER, owners.tier TEXT).
SCHEMAS: tuple[tuple[str, ...], ...] = ((), ("priority",), ("priority", "tier"))
# Amount distributions (database diversity); "uniform" is the original.
VALUE_DISTS = {
    "uniform": lambda rng: rng.randint(5, 500),
    "skewed": lambda rng: int(5 + 495 * rng.random() ** 3),
    "narrow": lambda rng: rng.randint(90, 110),
}


@dataclass(frozen=True)
class EnvSpec:
    """One environment's names, tools and schema; JSON-able (env.json's "spec")."""

    domain: str
    owner: str
    record: str
    verbs: dict[str, str]  # tool template -> verb, in tool-list order
    keys: dict[str, str]  # canonical argument -> this environment's name
    columns: tuple[str, ...] = ()  # extra columns, from SCHEMAS
    amount: str = "integer"  # the amount column's type: integer or real (tenths)
    values: str = "uniform"  # the amount distribution (VALUE_DISTS)
    owners: int = 0  # owners in the database; 0: params envs.owners_per_env

    @property
    def entities(self) -> Domain:
        """The domain under this environment's entity names."""
        return replace(DOMAINS[self.domain], owner=self.owner, record=self.record)

    def tool_name(self, template: str) -> str:
        d = self.entities
        fill = {"owner": d.owner, "record": d.record, "item": d.item}
        return TOOL_TEMPLATES[template].name.format(verb=self.verbs[template], **fill)

    def arg_names(self, template: str) -> list[str]:
        return [self.keys[a] for a in TOOL_TEMPLATES[template].args]

    def tools(self) -> list[ToolSpec]:
        d = self.entities
        out = []
        for template in self.verbs:
            t = TOOL_TEMPLATES[template]
            props = {self.keys[a]: self.arg_schema(a) for a in t.args}
            schema = {"type": "object", "properties": props, "required": list(props)}
            desc = t.description.format(owner=d.owner, record=d.record, item=d.item)
            out.append(ToolSpec(self.tool_name(template), desc, schema))
        return out

    def arg_schema(self, arg: str) -> dict:
        typed = {"type": KEYS[arg][1]}
        return {**typed, "enum": list(self.entities.statuses)} if arg == "status" else typed

    def call(self, template: str, *values) -> ToolCall:
        args = dict(zip(self.arg_names(template), values, strict=True))
        return ToolCall(self.tool_name(template), args)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_meta(cls, meta: dict) -> EnvSpec:
        """The spec an env.json names, or its domain's default."""
        if "spec" not in meta:
            return default_spec(meta["domain"])
        raw = meta["spec"]
        return cls(**{**raw, "columns": tuple(raw.get("columns", ()))})


def default_spec(domain: str) -> EnvSpec:
    d = DOMAINS[domain]
    verbs = {t: TOOL_TEMPLATES[t].verbs[0] for t in DEFAULT_TOOLS}
    return EnvSpec(domain, d.owner, d.record, verbs, resolve_keys(d.owner, d.record, None))


def resolve_keys(owner: str, record: str, rng: random.Random | None) -> dict[str, str]:
    """Argument names: the defaults, or one synonym each drawn from `rng`."""
    pick = (lambda names: rng.choice(names)) if rng else (lambda names: names[0])
    return {k: pick(names).format(owner=owner, record=record) for k, (names, _) in KEYS.items()}


def draw_spec(cfg, domain: str, rng: random.Random) -> EnvSpec:
    """One environment's spec under the knobs of `cfg` (params `envs`); `rng` is its own stream."""
    d = DOMAINS[domain]
    owner, record = d.owner, d.record
    if cfg.entity_synonyms:
        owner, record = rng.choice((owner, *ALIASES[owner])), rng.choice((record, *ALIASES[record]))
    templates = list(cfg.tool_templates)
    if cfg.tools_per_env:  # the entry points stay: without them most task kinds cannot start
        kept = [t for t in templates if t in ENTRY_TOOLS]
        rest = [t for t in templates if t not in ENTRY_TOOLS]
        picked = set(kept + rng.sample(rest, max(0, min(cfg.tools_per_env - len(kept), len(rest)))))
        templates = [t for t in templates if t in picked]
    if cfg.distractor_tools:
        templates += rng.sample(DISTRACTORS, min(cfg.distractor_tools, len(DISTRACTORS)))
        rng.shuffle(templates)  # distractors are not told apart by their place in the list
    synonyms = cfg.tool_synonyms
    verbs = {t: (rng.choice if synonyms else first)(TOOL_TEMPLATES[t].verbs) for t in templates}
    spec = EnvSpec(
        domain,
        owner,
        record,
        verbs,
        resolve_keys(owner, record, rng if synonyms else None),
        columns=SCHEMAS[rng.randrange(cfg.schema_templates)],
        amount=rng.choice(cfg.amount_types),
        values=rng.choice(cfg.value_dists),
        owners=rng.randint(cfg.owners_min, cfg.owners_per_env) if cfg.owners_min else 0,
    )
    names = [t.name for t in spec.tools()]
    if len(set(names)) != len(names):  # cannot happen with the templates above; guard anyway
        raise ValueError(f"tool names collide in a {domain} environment: {names}")
    return spec


def first(options: tuple[str, ...]) -> str:
    return options[0]


def total_amount(amounts: list) -> int | float:
    """The aggregate tool's sum; real amounts are rounded to tenths so the oracle's answer and
    the tool's observation print alike."""
    total = sum(amounts)
    return round(total, 1) if isinstance(total, float) else total
