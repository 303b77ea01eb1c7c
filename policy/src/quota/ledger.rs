//! The tenant-wide quota as a running ledger (pure): what each tenant object takes, which
//! objects hold their share, and the verdicts of those waiting, kept current from watch events
//! so that a verdict is a lookup, never a recount.
//!
//! Data flow: the syncer feeds the ledger every tenant object its watches see
//! ([`Ledger::tenant`]) and every host object it made of one ([`Ledger::host`]). A reconcile
//! asks for an object's verdict ([`Ledger::judge`]) and, just before it creates the host
//! object, takes the share ([`Ledger::admit`]): from then on the object *holds* it until the
//! object is gone, terminating or (a pod) finished. [`super::admitted`] is this ledger fed
//! all at once, so the rules are one set:
//! - an object on the host holds its share, even above the quota (a lowered quota never
//!   evicts what runs, and a restarted syncer keeps what it had);
//! - the others wait in line, in creation order (then namespace, then name), and each is
//!   admitted iff it fits in what the holders and the admitted objects before it in line left;
//!   a refused object takes nothing;
//! - objects in a namespace that waits (over the plan's namespace count) wait with it.
//!
//! Cost: feeding an object is O(log n). A verdict is O(1) while everything waiting fits at
//! once (a tenant within its quota: the common case, and a burst of creates), and otherwise a
//! lookup in the line's plan. The plan is computed in O(waiting), and only after a change
//! that can move a verdict: a holder or an admitted waiter going, an amount changing, or an
//! object entering the line anywhere but at its end (the usual new object enters at the end
//! and is judged alone). Taking a share never moves another verdict: whatever the plan
//! admitted ahead of or behind the taker fit with the taker's share counted already.

use super::{Hard, Key, Quota, RULE, Usage, count_refusal, show_bytes, show_cpu};
use crate::Refusal;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeSet, HashMap, HashSet};
use vcp_core::naming;

/// The kinds the quota counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Pod,
    Service,
    Claim,
}

/// A tenant kind the quota counts: whether an object is judged at all, and what it takes.
pub trait Counted: kube_core::Resource<DynamicType = ()> {
    const KIND: Kind;

    /// Whether the object is judged: terminating objects, finished pods and the tenant
    /// apiserver's own Service take nothing and need nothing.
    fn counts(&self) -> bool;

    /// What the object takes of `quota` (only its own kind's resources), or why that cannot
    /// be known (a quantity that does not parse: the object never fits).
    fn takes(&self, quota: &Quota) -> Result<Usage, Refusal>;
}

/// An object's verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Judgement {
    /// It holds its share (it is on the host, or was admitted).
    Holds,
    /// It fits: [`Ledger::admit`] would let it hold its share.
    Admitted,
    /// It waits, for this reason.
    Refused(Refusal),
    /// Not in the ledger: not judged (see [`Counted::counts`]) or not seen yet.
    Unknown,
}

impl Kind {
    /// The kind of a Kubernetes kind name (`"Pod"`), if the quota counts it.
    pub fn of(kind: &str) -> Option<Kind> {
        match kind {
            "Namespace" => Some(Kind::Namespace),
            "Pod" => Some(Kind::Pod),
            "Service" => Some(Kind::Service),
            "PersistentVolumeClaim" => Some(Kind::Claim),
            _ => None,
        }
    }
}

impl Judgement {
    /// Holds or admitted.
    pub fn fits(&self) -> bool {
        matches!(self, Judgement::Holds | Judgement::Admitted)
    }
}

/// A place in line: creation time, then namespace and name.
type Line = (Option<Timestamp>, Key);

#[derive(Debug, Clone)]
struct Entry {
    uid: Option<String>,
    created: Option<Timestamp>,
    takes: Result<Usage, Refusal>,
    holds: bool,
}

impl Entry {
    /// What it takes, for sums: nothing if its amount is unknown (it never fits then).
    fn amount(&self) -> Usage {
        self.takes.clone().unwrap_or_default()
    }
}

/// The verdicts of the objects waiting in one kind's line.
#[derive(Debug, Clone, Default)]
struct Plan {
    /// `None`: admitted.
    verdicts: HashMap<Key, Option<Refusal>>,
    /// The holders' share plus the admitted waiters'.
    used: Usage,
    /// The last place in line when the plan was made or extended.
    last: Option<Line>,
}

/// One kind's objects.
#[derive(Debug, Clone, Default)]
struct Book {
    /// Every object that counts, by key.
    entries: HashMap<Key, Entry>,
    /// The keys of host objects made of this kind's tenant objects (whether or not the
    /// tenant object is known yet).
    placed: HashSet<Key>,
    /// The entries that do not hold, in line order.
    line: BTreeSet<Line>,
    /// What the holders take.
    held: Usage,
    /// What the waiting entries take (those whose amount is known).
    waiting: Usage,
    /// `None` when a change may have moved a verdict.
    plan: Option<Plan>,
}

/// The tenant's quota ledger (see the module docs).
#[derive(Debug, Clone)]
pub struct Ledger {
    quota: Quota,
    hard: Hard,
    namespaces: Book,
    pods: Book,
    services: Book,
    claims: Book,
    /// Plans made from scratch (tests count them: a verdict must not recount).
    plans_made: u64,
}

impl Ledger {
    pub fn new(quota: &Quota) -> Ledger {
        Ledger {
            quota: quota.clone(),
            hard: quota.hard(),
            namespaces: Book::default(),
            pods: Book::default(),
            services: Book::default(),
            claims: Book::default(),
            plans_made: 0,
        }
    }

    fn book(&mut self, kind: Kind) -> &mut Book {
        match kind {
            Kind::Namespace => &mut self.namespaces,
            Kind::Pod => &mut self.pods,
            Kind::Service => &mut self.services,
            Kind::Claim => &mut self.claims,
        }
    }

    /// After a change to the namespaces: which namespaces wait may have changed, and with
    /// them the objects waiting in them.
    fn namespaces_changed(&mut self) {
        self.namespaces.plan = None;
        self.pods.plan = None;
        self.services.plan = None;
        self.claims.plan = None;
    }

    /// A tenant object as its watch saw it: present (listed, created, changed) or gone.
    pub fn tenant<K: Counted>(&mut self, obj: &K, present: bool) {
        let key = super::key(obj);
        let m = obj.meta();
        if !present || !obj.counts() {
            // A deletion seen late must not remove an object recreated under the same name.
            let same = |e: &Entry| e.uid.is_none() || m.uid.is_none() || e.uid == m.uid;
            if present || self.book(K::KIND).entries.get(&key).is_some_and(same) {
                self.remove(K::KIND, &key);
            }
            return;
        }
        let entry = Entry {
            uid: m.uid.clone(),
            created: m.creation_timestamp.as_ref().map(|t| t.0),
            takes: obj.takes(&self.quota),
            holds: false,
        };
        if let Some(old) = self.book(K::KIND).entries.get(&key) {
            if old.uid == entry.uid && old.created == entry.created && old.takes == entry.takes {
                return;
            }
            if old.uid == entry.uid && old.created == entry.created && old.holds {
                // Its amount changed (a pod resized in place): it keeps holding, at the new one.
                let (before, after) = (old.amount(), entry.amount());
                let book = self.book(K::KIND);
                book.held = book.held.minus(&before).plus(&after);
                if let Some(e) = book.entries.get_mut(&key) {
                    e.takes = entry.takes;
                }
                book.plan = None;
                if K::KIND == Kind::Namespace {
                    self.namespaces_changed();
                }
                return;
            }
            self.remove(K::KIND, &key);
        }
        self.insert(K::KIND, key, entry);
    }

    /// A host object of this tenant's as the host watch saw it. Only objects the syncer made
    /// (its markers, where it puts them) count as placed.
    /// `K` is the counted kind; `H` its host object as the host watch decodes it (a host pod is
    /// narrowed, [`vcp_core::host_pod::HostPod`]): only its markers are read.
    pub fn host<K: Counted, H: kube_core::Resource>(
        &mut self,
        tenant: &naming::TenantKey,
        obj: &H,
        present: bool,
    ) {
        if let Some(key) = placed_key(tenant, obj) {
            self.place(K::KIND, key, present);
        }
    }

    /// The tenant object `key` of `kind` has (`present`) or no longer has a host object.
    pub fn place(&mut self, kind: Kind, key: Key, present: bool) {
        let book = self.book(kind);
        if !present {
            // Holding does not end here: the object holds until the tenant object goes.
            book.placed.remove(&key);
            return;
        }
        if !book.placed.insert(key.clone()) {
            return;
        }
        if book.entries.get(&key).is_some_and(|e| !e.holds) {
            self.hold(kind, &key);
        }
    }

    fn insert(&mut self, kind: Kind, key: Key, mut entry: Entry) {
        let book = self.book(kind);
        if book.placed.contains(&key) {
            entry.holds = true;
            book.held = book.held.plus(&entry.amount());
            book.entries.insert(key, entry);
            // A new holder leaves less for the line.
            book.plan = None;
        } else {
            let line = (entry.created, key.clone());
            let at_end = book.line.last().is_none_or(|last| *last < line);
            book.waiting = book.waiting.plus(&entry.amount());
            book.line.insert(line.clone());
            book.entries.insert(key.clone(), entry);
            let extends = at_end
                && book
                    .plan
                    .as_ref()
                    .is_some_and(|p| p.last.as_ref().is_none_or(|l| *l < line));
            if extends {
                // Judged alone, after everything before it in line.
                let gate = (kind != Kind::Namespace)
                    .then(|| self.waiting_namespace(&key.0))
                    .flatten();
                let (quota, hard) = (&self.quota, &self.hard);
                let book = match kind {
                    Kind::Namespace => &mut self.namespaces,
                    Kind::Pod => &mut self.pods,
                    Kind::Service => &mut self.services,
                    Kind::Claim => &mut self.claims,
                };
                let entry = &book.entries[&key];
                let plan = book.plan.as_mut().expect("checked above");
                let verdict = gate.or_else(|| judge(kind, entry, &plan.used, quota, hard).err());
                if verdict.is_none() {
                    plan.used = plan.used.plus(&entry.amount());
                }
                plan.verdicts.insert(key, verdict);
                plan.last = Some(line);
            } else {
                book.plan = None;
            }
        }
        if kind == Kind::Namespace {
            self.namespaces_changed();
        }
    }

    fn remove(&mut self, kind: Kind, key: &Key) {
        let book = self.book(kind);
        let Some(entry) = book.entries.remove(key) else {
            return;
        };
        if entry.holds {
            book.held = book.held.minus(&entry.amount());
            // Its share is free: the line may move.
            book.plan = None;
        } else {
            book.line.remove(&(entry.created, key.clone()));
            book.waiting = book.waiting.minus(&entry.amount());
            match book.plan.as_mut() {
                // A refused waiter took nothing: no other verdict moves.
                Some(p) if matches!(p.verdicts.get(key), Some(Some(_))) => {
                    p.verdicts.remove(key);
                }
                _ => book.plan = None,
            }
        }
        if kind == Kind::Namespace {
            self.namespaces_changed();
        }
    }

    /// Moves a waiting entry to the holders.
    fn hold(&mut self, kind: Kind, key: &Key) {
        let book = self.book(kind);
        let Some(entry) = book.entries.get_mut(key) else {
            return;
        };
        if entry.holds {
            return;
        }
        entry.holds = true;
        let amount = entry.amount();
        book.line.remove(&(entry.created, key.clone()));
        book.waiting = book.waiting.minus(&amount);
        book.held = book.held.plus(&amount);
        match book.plan.as_mut() {
            // Admitted by the plan: its share was counted already, nothing moves.
            Some(p) if matches!(p.verdicts.get(key), Some(None)) => {
                p.verdicts.remove(key);
            }
            _ => book.plan = None,
        }
        if kind == Kind::Namespace {
            self.namespaces_changed();
        }
    }

    /// Why objects in tenant namespace `ns` wait, if its namespace waits.
    fn waiting_namespace(&mut self, ns: &str) -> Option<Refusal> {
        let key = (String::new(), ns.to_owned());
        match self.judge_in(Kind::Namespace, &key) {
            Judgement::Refused(_) => Some(Refusal::new(
                "metadata.namespace",
                RULE,
                format!(
                    "namespace {ns} is over the plan's namespace count and not on the host; objects in it wait"
                ),
            )),
            _ => None,
        }
    }

    /// Whether the objects of `kind` that hold their share fit the quota together. A pod
    /// resized in place holds at its new size at once (see [`Ledger::tenant`]); the syncer
    /// passes a resize that asks for more to the host only while this holds.
    pub fn holders_fit(&mut self, kind: Kind) -> bool {
        let hard = self.hard;
        self.book(kind).held.within(&hard)
    }

    /// The verdict of object `key` of `kind` (namespaces: `("", name)`).
    pub fn judge(&mut self, kind: Kind, key: &Key) -> Judgement {
        self.judge_in(kind, key)
    }

    /// The verdict of object `key` and, if it fits, its share taken: it holds from now on
    /// (until it is gone). Call it right before creating the host object, so two objects
    /// can never both take the last share.
    pub fn admit(&mut self, kind: Kind, key: &Key) -> Judgement {
        let j = self.judge_in(kind, key);
        if j == Judgement::Admitted {
            self.hold(kind, key);
        }
        j
    }

    fn judge_in(&mut self, kind: Kind, key: &Key) -> Judgement {
        let Some(entry) = self.book(kind).entries.get(key) else {
            return Judgement::Unknown;
        };
        if entry.holds {
            return Judgement::Holds;
        }
        let unknown = entry.takes.clone().err();
        if kind != Kind::Namespace
            && let Some(r) = self.waiting_namespace(&key.0)
        {
            return Judgement::Refused(r);
        }
        if let Some(r) = unknown {
            return Judgement::Refused(r);
        }
        // Everything waiting fits at once: every waiter is admitted, whatever the order.
        let hard = self.hard;
        let book = self.book(kind);
        if book.held.plus(&book.waiting).within(&hard) {
            return Judgement::Admitted;
        }
        self.ensure_plan(kind);
        match self
            .book(kind)
            .plan
            .as_ref()
            .and_then(|p| p.verdicts.get(key))
        {
            Some(None) => Judgement::Admitted,
            Some(Some(r)) => Judgement::Refused(r.clone()),
            None => Judgement::Unknown,
        }
    }

    /// Makes `kind`'s plan if a change dropped it: the line judged from its start.
    fn ensure_plan(&mut self, kind: Kind) {
        if self.book(kind).plan.is_some() {
            return;
        }
        if kind != Kind::Namespace {
            self.ensure_plan(Kind::Namespace);
        }
        self.plans_made += 1;
        // Which namespaces wait, for the objects in them.
        let gates: HashMap<String, Refusal> = if kind == Kind::Namespace {
            HashMap::new()
        } else {
            let book = self.book(kind);
            let namespaces: BTreeSet<String> = book.line.iter().map(|(_, k)| k.0.clone()).collect();
            namespaces
                .into_iter()
                .filter_map(|ns| self.waiting_namespace(&ns).map(|r| (ns, r)))
                .collect()
        };
        let (quota, hard) = (&self.quota, &self.hard);
        let book = match kind {
            Kind::Namespace => &mut self.namespaces,
            Kind::Pod => &mut self.pods,
            Kind::Service => &mut self.services,
            Kind::Claim => &mut self.claims,
        };
        let mut plan = Plan {
            used: book.held,
            last: book.line.last().cloned(),
            ..Plan::default()
        };
        for (_, key) in &book.line {
            let entry = &book.entries[key];
            let verdict = gates
                .get(&key.0)
                .cloned()
                .or_else(|| judge(kind, entry, &plan.used, quota, hard).err());
            if verdict.is_none() {
                plan.used = plan.used.plus(&entry.amount());
            }
            plan.verdicts.insert(key.clone(), verdict);
        }
        book.plan = Some(plan);
    }

    /// What the holders and the admitted waiters take together (the tenant's usage as the
    /// quota sees it).
    pub fn used(&mut self) -> Usage {
        let mut total = Usage::default();
        for kind in [Kind::Namespace, Kind::Pod, Kind::Service, Kind::Claim] {
            self.ensure_plan(kind);
            if let Some(p) = &self.book(kind).plan {
                total = total.plus(&p.used);
            }
        }
        total
    }

    /// Every object's verdict, by kind (holders admitted).
    pub fn verdicts(&mut self) -> super::Verdicts {
        let mut v = super::Verdicts::default();
        for kind in [Kind::Namespace, Kind::Pod, Kind::Service, Kind::Claim] {
            let keys: Vec<Key> = self.book(kind).entries.keys().cloned().collect();
            for key in keys {
                let refusals = match self.judge_in(kind, &key) {
                    Judgement::Refused(r) => vec![r],
                    _ => Vec::new(),
                };
                match kind {
                    Kind::Namespace => {
                        v.namespaces.insert(key.1, refusals);
                    }
                    Kind::Pod => {
                        v.pods.insert(key, refusals);
                    }
                    Kind::Service => {
                        v.services.insert(key, refusals);
                    }
                    Kind::Claim => {
                        v.claims.insert(key, refusals);
                    }
                }
            }
        }
        v
    }
}

/// The key of the tenant object host object `obj` was made of, if the syncer made it for
/// `tenant`: its markers name the object, and it sits where the syncer puts that object.
fn placed_key<K: kube_core::Resource>(tenant: &naming::TenantKey, obj: &K) -> Option<Key> {
    let m = obj.meta();
    let none = std::collections::BTreeMap::new();
    let r = naming::tenant_ref(
        tenant,
        m.labels.as_ref().unwrap_or(&none),
        m.annotations.as_ref().unwrap_or(&none),
    )?;
    match (&m.namespace, &r.namespace) {
        (None, None) if m.name.as_deref() == Some(&naming::host_namespace(tenant, &r.name)) => {
            Some((String::new(), r.name))
        }
        (Some(host_ns), Some(ns))
            if *host_ns == naming::host_namespace(tenant, ns)
                && m.name.as_deref() == Some(&r.name) =>
        {
            Some((ns.clone(), r.name))
        }
        _ => None,
    }
}

/// Whether `more` fits on top of `used` within `hard`. A resource the object does not take
/// is not looked at, so an object is never kept waiting for a resource it does not use (only
/// holders above a lowered quota can exceed a limit).
fn fits(used: u64, more: u64, hard: Option<u64>) -> bool {
    more == 0 || hard.is_none_or(|h| used.saturating_add(more) <= h)
}

/// Whether `entry` fits on top of `used`: `Err` says why not, in the words of the resource
/// that does not fit (the first that does not, in a fixed order).
fn judge(
    kind: Kind,
    entry: &Entry,
    used: &Usage,
    quota: &Quota,
    hard: &Hard,
) -> Result<(), Refusal> {
    let more = entry.takes.clone()?;
    match kind {
        Kind::Namespace => {
            if !fits(used.namespaces, more.namespaces, hard.namespaces) {
                return Err(count_refusal("namespaces", "namespaces", hard.namespaces));
            }
        }
        Kind::Service => {
            if !fits(used.services, more.services, hard.services) {
                return Err(count_refusal("Services", "services", hard.services));
            }
        }
        Kind::Claim => {
            if !fits(
                used.persistent_volume_claims,
                more.persistent_volume_claims,
                hard.persistent_volume_claims,
            ) {
                return Err(count_refusal(
                    "PersistentVolumeClaims",
                    "persistent_volume_claims",
                    hard.persistent_volume_claims,
                ));
            }
            if !fits(
                used.requests_storage,
                more.requests_storage,
                hard.requests_storage,
            ) {
                return Err(Refusal::new(
                    "quota.requests_storage",
                    RULE,
                    format!(
                        "the claim's storage request ({}) does not fit in what other claims left of the plan's {}; it waits until it does",
                        show_bytes(more.requests_storage),
                        quota
                            .requests_storage
                            .as_ref()
                            .map(|q| q.0.as_str())
                            .unwrap_or_default()
                    ),
                ));
            }
        }
        Kind::Pod => {
            if !fits(used.pods, more.pods, hard.pods) {
                return Err(count_refusal("pods", "pods", hard.pods));
            }
            let checks = [
                (
                    used.requests_cpu,
                    more.requests_cpu,
                    hard.requests_cpu,
                    "requests_cpu",
                    "CPU requests",
                    show_cpu(more.requests_cpu),
                    &quota.requests_cpu,
                ),
                (
                    used.requests_memory,
                    more.requests_memory,
                    hard.requests_memory,
                    "requests_memory",
                    "memory requests",
                    show_bytes(more.requests_memory),
                    &quota.requests_memory,
                ),
                (
                    used.limits_cpu,
                    more.limits_cpu,
                    hard.limits_cpu,
                    "limits_cpu",
                    "CPU limits",
                    show_cpu(more.limits_cpu),
                    &quota.limits_cpu,
                ),
                (
                    used.limits_memory,
                    more.limits_memory,
                    hard.limits_memory,
                    "limits_memory",
                    "memory limits",
                    show_bytes(more.limits_memory),
                    &quota.limits_memory,
                ),
            ];
            if let Some((_, _, _, field, what, amount, total)) =
                checks.iter().find(|(u, m, h, ..)| !fits(*u, *m, *h))
            {
                return Err(Refusal::new(
                    format!("quota.{field}"),
                    RULE,
                    format!(
                        "the pod's {what} ({amount}) do not fit in what other pods left of the plan's {}; it waits until they do",
                        total.as_ref().map(|q| q.0.as_str()).unwrap_or_default()
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::{Limits, Quantity};
    use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Service};
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use vcp_fixtures::{arb_claim, arb_namespaces, arb_pod, arb_services, at, dedup, plain};

    fn quota(limits: (u64, u64, u64, u64, u64, u64)) -> Quota {
        let (pods, cpu_m, services, claims, storage_gi, ns) = limits;
        Quota {
            pods: Some(pods),
            requests_cpu: Some(Quantity(format!("{cpu_m}m"))),
            requests_memory: Some("2Gi".into()),
            limits_cpu: Some("6".into()),
            limits_memory: None,
            services: Some(services),
            persistent_volume_claims: Some(claims),
            requests_storage: Some(Quantity(format!("{storage_gi}Gi"))),
            namespaces: Some(ns),
            limits: Limits::default(),
        }
    }

    /// One tenant object of any counted kind.
    #[derive(Debug, Clone)]
    #[expect(
        clippy::large_enum_variant,
        reason = "a few dozen test objects; boxing pods would only obscure the feeding"
    )]
    enum Obj {
        Namespace(Namespace),
        Pod(Pod),
        Service(Service),
        Claim(PersistentVolumeClaim),
    }

    macro_rules! each {
        ($o:expr, $x:ident => $e:expr) => {
            match $o {
                Obj::Namespace($x) => $e,
                Obj::Pod($x) => $e,
                Obj::Service($x) => $e,
                Obj::Claim($x) => $e,
            }
        };
    }

    impl Obj {
        fn kind(&self) -> Kind {
            match self {
                Obj::Namespace(_) => Kind::Namespace,
                Obj::Pod(_) => Kind::Pod,
                Obj::Service(_) => Kind::Service,
                Obj::Claim(_) => Kind::Claim,
            }
        }

        fn key(&self) -> Key {
            each!(self, o => crate::quota::key(o))
        }

        fn feed(&self, l: &mut Ledger, present: bool) {
            each!(self, o => l.tenant(o, present))
        }

        fn counts(&self) -> bool {
            each!(self, o => o.counts())
        }

        fn takes(&self, q: &Quota) -> Result<Usage, Refusal> {
            each!(self, o => o.takes(q))
        }

        fn created(&self) -> Option<Timestamp> {
            each!(self, o => o.metadata.creation_timestamp.as_ref().map(|t| t.0))
        }

        fn terminate(&mut self) {
            each!(self, o => o.metadata.deletion_timestamp = o.metadata.creation_timestamp.clone())
        }
    }

    /// The line judged from its start by the rules alone, as plainly as they can be written:
    /// the holders' share first, then every other counted object in line order, kind by kind,
    /// namespaces first. `true`: admitted.
    fn reference(
        objects: &[Obj],
        held: &BTreeSet<(Kind, Key)>,
        q: &Quota,
    ) -> BTreeMap<(Kind, Key), bool> {
        let hard = q.hard().values();
        let fits = |used: &Usage, more: &Usage| {
            used.values()
                .iter()
                .zip(more.values())
                .zip(hard)
                .all(|((u, m), h)| m == 0 || h.is_none_or(|h| u + m <= h))
        };
        let mut used = Usage::default();
        for o in objects {
            if held.contains(&(o.kind(), o.key())) {
                used = used.plus(&o.takes(q).unwrap_or_default());
            }
        }
        let mut out = BTreeMap::new();
        for kind in [Kind::Namespace, Kind::Pod, Kind::Service, Kind::Claim] {
            let mut line: Vec<&Obj> = objects
                .iter()
                .filter(|o| o.kind() == kind && o.counts() && !held.contains(&(kind, o.key())))
                .collect();
            line.sort_by_key(|o| (o.created(), o.key()));
            for o in line {
                let ns_waits = kind != Kind::Namespace
                    && out.get(&(Kind::Namespace, (String::new(), o.key().0))) == Some(&false);
                let ok = !ns_waits && o.takes(q).is_ok_and(|t| fits(&used, &t));
                if ok {
                    used = used.plus(&o.takes(q).unwrap_or_default());
                }
                out.insert((kind, o.key()), ok);
            }
        }
        out
    }

    fn arb_objects() -> impl Strategy<Value = Vec<Obj>> {
        (
            proptest::collection::vec(arb_pod(), 0..24),
            proptest::collection::vec(arb_claim(), 0..8),
            arb_services(),
            arb_namespaces(&["a", "default"]),
        )
            .prop_map(|(pods, claims, services, namespaces)| {
                let mut v: Vec<Obj> = namespaces.into_iter().map(Obj::Namespace).collect();
                v.extend(dedup(pods).into_iter().map(Obj::Pod));
                v.extend(services.into_iter().map(Obj::Service));
                v.extend(dedup(claims).into_iter().map(Obj::Claim));
                v
            })
    }

    /// What happens to one object: a watch event on either side, or a reconcile admitting it.
    #[derive(Debug, Clone, Copy)]
    enum Op {
        Seen,
        Gone,
        Placed,
        Unplaced,
        Admit,
        Judge,
        Terminating,
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Seen),
            1 => Just(Op::Gone),
            1 => Just(Op::Placed),
            1 => Just(Op::Unplaced),
            3 => Just(Op::Admit),
            2 => Just(Op::Judge),
            1 => Just(Op::Terminating),
        ]
    }

    proptest! {
        /// Whatever the order of events and admissions, every verdict the ledger gives is the
        /// one the line judged from scratch gives, holders aside; objects on the host hold;
        /// and without placements from outside, what the holders take stays within the quota.
        #[test]
        fn the_running_ledger_judges_as_the_whole_line_judged_from_scratch(
            objects in arb_objects(),
            ops in proptest::collection::vec((any::<prop::sample::Index>(), arb_op()), 0..120),
            limits in (1u64..8, 0u64..4000, 0u64..4, 0u64..5, 0u64..60, 0u64..4),
            outside in any::<bool>(),
        ) {
            prop_assume!(!objects.is_empty());
            let q = quota(limits);
            let mut l = Ledger::new(&q);
            let mut live: Vec<Option<Obj>> = vec![None; objects.len()];
            let mut placed: BTreeSet<(Kind, Key)> = BTreeSet::new();
            for (i, op) in ops {
                let i = i.index(objects.len());
                let o = &objects[i];
                let (kind, key) = (o.kind(), o.key());
                match op {
                    Op::Seen => {
                        o.feed(&mut l, true);
                        live[i] = Some(o.clone());
                    }
                    Op::Gone => {
                        o.feed(&mut l, false);
                        live[i] = None;
                    }
                    Op::Terminating => {
                        let mut t = o.clone();
                        t.terminate();
                        t.feed(&mut l, true);
                        live[i] = Some(t);
                    }
                    // Placements from outside the ledger's own admissions: a restarted syncer
                    // finding what its predecessor created.
                    Op::Placed if outside => {
                        l.place(kind, key.clone(), true);
                        placed.insert((kind, key));
                    }
                    Op::Unplaced => {
                        l.place(kind, key.clone(), false);
                        placed.remove(&(kind, key));
                    }
                    Op::Placed | Op::Admit => {
                        let before = l.judge(kind, &key);
                        let j = l.admit(kind, &key);
                        prop_assert_eq!(&before, &j);
                        if j.fits() {
                            prop_assert_eq!(l.judge(kind, &key), Judgement::Holds);
                        }
                    }
                    Op::Judge => {
                        let j = l.judge(kind, &key);
                        prop_assert_eq!(j == Judgement::Unknown, live[i].as_ref().is_none_or(|o| !o.counts()));
                    }
                }
            }
            let alive: Vec<Obj> = live.iter().flatten().filter(|o| o.counts()).cloned().collect();
            let mut held = BTreeSet::new();
            for o in &alive {
                let (kind, key) = (o.kind(), o.key());
                if l.judge(kind, &key) == Judgement::Holds {
                    held.insert((kind, key));
                }
            }
            for p in &placed {
                if alive.iter().any(|o| (o.kind(), o.key()) == *p) {
                    prop_assert!(held.contains(p), "{:?} is on the host and does not hold", p);
                }
            }
            let want = reference(&alive, &held, &q);
            for o in &alive {
                let (kind, key) = (o.kind(), o.key());
                if held.contains(&(kind, key.clone())) {
                    continue;
                }
                let j = l.judge(kind, &key);
                prop_assert_eq!(j.fits(), want[&(kind, key.clone())], "{:?} {:?}: {:?}", kind, key, j);
            }
            let holders: Usage = alive
                .iter()
                .filter(|o| held.contains(&(o.kind(), o.key())))
                .fold(Usage::default(), |u, o| u.plus(&o.takes(&q).unwrap_or_default()));
            if !outside {
                prop_assert!(holders.within(&q.hard()), "{:?} over {:?}", holders, q.hard());
            }
            let admitted: Usage = alive
                .iter()
                .filter(|o| !held.contains(&(o.kind(), o.key())) && want[&(o.kind(), o.key())])
                .fold(holders, |u, o| u.plus(&o.takes(&q).unwrap_or_default()));
            prop_assert_eq!(l.used(), admitted);
        }
    }

    #[test]
    fn judging_an_unknown_object_is_unknown() {
        let mut l = Ledger::new(&Quota::plan_default());
        assert_eq!(
            l.judge(Kind::Pod, &("a".into(), "p".into())),
            Judgement::Unknown
        );
    }

    /// What a verdict costs: a tenant within its quota never needs the line judged, and one far
    /// over it has it judged once, not once per object (new objects join at the end of the line
    /// and are judged alone).
    #[test]
    fn verdicts_do_not_recount_the_tenant() {
        let n = 10_000;
        let pods: Vec<Pod> = (0..n)
            .map(|i| plain("a", &format!("p{i:05}"), &at(i / 100)))
            .collect();
        let within = Quota {
            pods: Some(u64::from(n)),
            requests_cpu: None,
            requests_memory: None,
            limits_cpu: None,
            limits_memory: None,
            ..Quota::plan_default()
        };
        let mut l = Ledger::new(&within);
        for p in &pods {
            l.tenant(p, true);
            assert_eq!(
                l.admit(Kind::Pod, &crate::quota::key(p)),
                Judgement::Admitted
            );
        }
        assert_eq!(l.plans_made, 0, "within its quota no line is judged");

        let over = Quota {
            pods: Some(100),
            ..within
        };
        let mut l = Ledger::new(&over);
        for p in &pods {
            l.tenant(p, true);
            let _ = l.admit(Kind::Pod, &crate::quota::key(p));
        }
        assert!(l.plans_made <= 2, "{} plans for {n} pods", l.plans_made);
        assert_eq!(l.used().pods, 100);
        // Waiting pods asked again (every few seconds each) cost nothing more.
        let before = l.plans_made;
        for p in &pods {
            let _ = l.judge(Kind::Pod, &crate::quota::key(p));
        }
        assert_eq!(l.plans_made, before);
        // One holder goes: the line is judged once, and the first in line takes its place.
        l.tenant(&pods[0], false);
        assert_eq!(
            l.admit(Kind::Pod, &crate::quota::key(&pods[100])),
            Judgement::Admitted
        );
        assert!(matches!(
            l.judge(Kind::Pod, &crate::quota::key(&pods[101])),
            Judgement::Refused(_)
        ));
        assert_eq!(l.plans_made, before + 1);
    }

    #[test]
    fn a_deletion_seen_late_does_not_remove_the_object_recreated_under_its_name() {
        let q = Quota {
            pods: Some(1),
            ..Quota::plan_default()
        };
        let mut l = Ledger::new(&q);
        let mut old = plain("a", "web", &at(0));
        old.metadata.uid = Some("u1".into());
        let mut new = plain("a", "web", &at(1));
        new.metadata.uid = Some("u2".into());
        l.tenant(&old, true);
        l.tenant(&new, true);
        let k = crate::quota::key(&new);
        assert_eq!(l.admit(Kind::Pod, &k), Judgement::Admitted);
        l.tenant(&old, false);
        assert_eq!(l.judge(Kind::Pod, &k), Judgement::Holds);
        l.tenant(&new, false);
        assert_eq!(l.judge(Kind::Pod, &k), Judgement::Unknown);
    }

    #[test]
    fn a_holder_above_a_lowered_quota_keeps_its_place_and_the_line_waits() {
        let q = Quota {
            pods: Some(1),
            ..Quota::plan_default()
        };
        let mut l = Ledger::new(&q);
        let (a, b, c) = (
            plain("a", "a", &at(0)),
            plain("a", "b", &at(1)),
            plain("a", "c", &at(2)),
        );
        for p in [&a, &b, &c] {
            l.tenant(p, true);
        }
        // A syncer restarted under a lowered quota finds two pods on the host.
        l.place(Kind::Pod, crate::quota::key(&a), true);
        l.place(Kind::Pod, crate::quota::key(&b), true);
        assert_eq!(l.judge(Kind::Pod, &crate::quota::key(&b)), Judgement::Holds);
        assert!(matches!(
            l.admit(Kind::Pod, &crate::quota::key(&c)),
            Judgement::Refused(_)
        ));
        l.tenant(&a, false);
        assert!(
            matches!(
                l.judge(Kind::Pod, &crate::quota::key(&c)),
                Judgement::Refused(_)
            ),
            "still one over"
        );
        l.tenant(&b, false);
        assert_eq!(
            l.admit(Kind::Pod, &crate::quota::key(&c)),
            Judgement::Admitted
        );
    }
}
