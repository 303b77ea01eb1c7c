// vcp console (docs/console.md): the views over the public API, in plain JavaScript with no
// library and no build step, so the page works offline from the binary that serves it.
//
// Data flow: the user gives an API token (kept in sessionStorage: gone with the tab); every
// view reads the API through api() below with that token, so what a view shows is what the
// token may see (an admin's: the fleet; an owner's: its tenants), and every action is an API
// call, hence in the audit trail. api() also records each request and its answer in
// window.vcpRequests, for the tests to inspect what the page asked and was told.
//
// Everything shown comes from user input somewhere (tenant names, labels, condition messages,
// audit details): the page is built with createElement and text nodes only, never by parsing a
// string as HTML (the server's Content-Security-Policy also forbids inline script).
'use strict';

(() => {
  const TOKEN_KEY = 'vcp.console.token';
  // Fleet upgrades change by the second; a view of one asks again this often while open.
  const POLL_MS = 2000;
  // The record is for tests and debugging; a page left polling for days must not grow
  // without bound.
  const MAX_RECORDS = 10000;
  const SVG_NS = 'http://www.w3.org/2000/svg';

  window.vcpRequests = [];

  // Bumped on every change of view (and at logout): a poll or a late answer of a view the
  // user has left sees it changed and stops instead of drawing over the new view.
  let generation = 0;
  const live = (gen) => gen === generation;

  const byId = (id) => document.getElementById(id);

  // ---- building the page: elements and text only -------------------------------------

  function el(tag, attrs, ...children) {
    return build(document.createElement(tag), attrs, children);
  }

  function svg(tag, attrs, ...children) {
    return build(document.createElementNS(SVG_NS, tag), attrs, children);
  }

  function build(e, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'on') {
        for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
      } else if (k === 'data') {
        for (const [dk, dv] of Object.entries(v)) e.dataset[dk] = String(dv);
      } else {
        e.setAttribute(k, v === true ? '' : String(v));
      }
    }
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  // ---- the API: the one place that talks to the server ---------------------------------

  class ApiError extends Error {
    constructor(status, problem, text) {
      super(describe(status, problem, text));
      this.status = status;
      this.problem = problem;
    }
  }

  function describe(status, problem, text) {
    if (problem && typeof problem === 'object' && problem.title) {
      const field = problem.field ? ` (field: ${problem.field})` : '';
      return `${problem.status || status} ${problem.title}: ${problem.detail || ''}${field}`;
    }
    if (status === 0) return `the API did not answer: ${text}`;
    return `${status}: ${String(text).slice(0, 300)}`;
  }

  // Every request of the page goes through here: the token, the record, problem+json turned
  // into an ApiError, and a refused token (401) back to the login form.
  async function api(method, path, body) {
    const headers = { Accept: 'application/json' };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, cache: 'no-store', credentials: 'omit' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const record = { url: path, method, status: 0, body: '', at: new Date().toISOString() };
    window.vcpRequests.push(record);
    if (window.vcpRequests.length > MAX_RECORDS) window.vcpRequests.shift();
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (e) {
      record.body = String(e);
      throw new ApiError(0, null, String(e));
    }
    const text = await resp.text();
    record.status = resp.status;
    record.body = text;
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch (_) {
      json = null;
    }
    if (resp.status === 401) {
      logout(`The API refused the token: ${describe(401, json, text)}`);
      throw new ApiError(401, json, text);
    }
    if (!resp.ok) throw new ApiError(resp.status, json, text);
    return json;
  }

  const query = (params) => {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
    const s = q.toString();
    return s ? `?${s}` : '';
  };
  const seg = encodeURIComponent;

  // ---- formatting ----------------------------------------------------------------------

  function age(iso) {
    if (!iso) return '';
    const s = Math.max(0, Math.floor((Date.now() - Date.parse(iso)) / 1000));
    if (s >= 2 * 86400) return `${Math.floor(s / 86400)}d`;
    if (s >= 2 * 3600) return `${Math.floor(s / 3600)}h`;
    if (s >= 2 * 60) return `${Math.floor(s / 60)}m`;
    return `${s}s`;
  }

  function when(iso) {
    if (!iso) return '—';
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
  }

  function cpu(millis) {
    return millis % 1000 === 0 ? String(millis / 1000) : `${millis}m`;
  }

  function bytes(b) {
    const units = ['Ki', 'Mi', 'Gi', 'Ti', 'Pi', 'Ei'];
    for (let i = units.length - 1; i >= 0; i--) {
      const unit = 2 ** (10 * (i + 1));
      if (b >= unit) {
        return b % unit === 0 ? `${b / unit}${units[i]}` : `${(b / unit).toFixed(1)}${units[i]}`;
      }
    }
    return String(b);
  }

  // The quota's resources, as the API names them, and how each is written.
  const RESOURCES = [
    ['pods', 'Pods', String],
    ['requests_cpu', 'CPU requests', cpu],
    ['limits_cpu', 'CPU limits', cpu],
    ['requests_memory', 'Memory requests', bytes],
    ['limits_memory', 'Memory limits', bytes],
    ['services', 'Services', String],
    ['persistent_volume_claims', 'Volume claims', String],
    ['requests_storage', 'Storage requests', bytes],
    ['namespaces', 'Namespaces', String],
  ];

  function badge(text, cls, title) {
    return el('span', { class: `badge ${cls || ''}`.trim(), title }, text);
  }

  function problemBox(err) {
    return el('p', { class: 'problem', role: 'alert' }, err instanceof Error ? err.message : String(err));
  }

  function table(headers, rows, attrs) {
    return el('table', attrs || {},
      el('thead', {}, el('tr', {}, headers.map((h) => el('th', {}, h)))),
      el('tbody', {}, rows));
  }

  // ---- login and routing ---------------------------------------------------------------

  function showLogin(message) {
    byId('nav').hidden = true;
    byId('main').hidden = true;
    byId('main').replaceChildren();
    byId('login-view').hidden = false;
    const m = byId('login-message');
    m.textContent = message || '';
    m.hidden = !message;
    byId('token').focus();
  }

  function logout(message) {
    sessionStorage.removeItem(TOKEN_KEY);
    generation++;
    showLogin(message);
  }

  function parseHash() {
    const h = location.hash.replace(/^#/, '') || '/fleet';
    const i = h.indexOf('?');
    const path = i < 0 ? h : h.slice(0, i);
    const params = new URLSearchParams(i < 0 ? '' : h.slice(i + 1));
    let parts;
    try {
      parts = path.split('/').filter(Boolean).map(decodeURIComponent);
    } catch (_) {
      parts = ['invalid'];
    }
    return { parts, params };
  }

  function route() {
    generation++;
    const gen = generation;
    if (!sessionStorage.getItem(TOKEN_KEY)) {
      showLogin();
      return;
    }
    byId('login-view').hidden = true;
    byId('nav').hidden = false;
    const main = byId('main');
    main.hidden = false;
    main.replaceChildren();
    const { parts, params } = parseHash();
    const view = parts[0] || 'fleet';
    for (const a of document.querySelectorAll('nav a[data-view]')) {
      a.classList.toggle('active', a.dataset.view === (view === 'tenants' ? 'fleet' : view));
    }
    if (view === 'fleet' || (view === 'tenants' && !parts[1])) fleetView(main, gen);
    else if (view === 'tenants') tenantView(main, gen, parts[1], params.get('owner'));
    else if (view === 'upgrades' && parts[1]) upgradeView(main, gen, parts[1]);
    else if (view === 'upgrades') upgradesView(main, gen);
    else if (view === 'versions') versionsView(main, gen);
    else main.append(problemBox(`No such view: ${location.hash}`));
  }

  function tenantHref(t) {
    return `#/tenants/${seg(t.name)}${query({ owner: t.owner })}`;
  }

  // ---- fleet -----------------------------------------------------------------------------

  // How much a tenant needs someone's attention: 0 failed, 1 a condition that does not hold
  // (provisioning, upgrading, broken), 2 fine. The fleet is sorted by it unless a header is
  // clicked, so failing tenants come first.
  function attention(t) {
    if (t.phase === 'Failed') return 0;
    if ((t.conditions || []).some((c) => c.status !== 'True')) return 1;
    return 2;
  }

  function usageSummary(u) {
    if (!u) return '';
    const used = u.used || {};
    return `pods ${used.pods ?? 0} · cpu ${cpu(used.requests_cpu ?? 0)} · mem ${bytes(used.requests_memory ?? 0)} · ${age(u.sampled_at)} ago`;
  }

  const FLEET_COLUMNS = [
    ['name', 'Name', (t) => t.name],
    ['owner', 'Owner', (t) => t.owner],
    ['phase', 'Phase', (t) => t.phase],
    ['conditions', 'Conditions', (t) => (t.conditions || []).filter((c) => c.status !== 'True').length],
    ['version', 'Version', (t) => t.kubernetes_version || t.version],
    ['plan', 'Plan', (t) => t.plan],
    ['age', 'Age', (t) => -Date.parse(t.created_at)],
    ['endpoint', 'Endpoint', (t) => t.endpoint || ''],
    ['usage', 'Last usage sample', (t) => (t.usage ? Date.parse(t.usage.sampled_at) : 0)],
  ];

  // Kept across visits of the view, as a person expects of a filter box.
  const fleetState = { filter: '', sort: null, dir: 1 };

  function compare(a, b) {
    if (typeof a === 'number' && typeof b === 'number') return a - b;
    return String(a).localeCompare(String(b));
  }

  function searchable(t) {
    const labels = Object.entries(t.labels || {}).map(([k, v]) => `${k}=${v}`);
    const conds = (t.conditions || []).map((c) => `${c.type} ${c.status} ${c.reason} ${c.message}`);
    return [t.name, t.owner, t.phase, t.version, t.kubernetes_version, t.plan, t.endpoint, ...labels, ...conds]
      .join(' ').toLowerCase();
  }

  function conditionsCell(t) {
    const conds = t.conditions || [];
    const bad = conds.filter((c) => c.status !== 'True');
    if (conds.length === 0) return el('td', { class: 'muted' }, 'none yet');
    if (bad.length === 0) return el('td', {}, badge(`all ${conds.length} True`, 'ok'));
    return el('td', {}, bad.map((c) => badge(`${c.type}=${c.status}`, c.status === 'False' ? 'bad' : 'warn',
      `${c.reason}: ${c.message}`)), el('span', { class: 'muted' }, ` of ${conds.length}`));
  }

  function fleetRow(t) {
    const rank = attention(t);
    const labels = Object.entries(t.labels || {}).map(([k, v]) => badge(`${k}=${v}`));
    return el('tr', { class: rank === 0 ? 'failing' : rank === 1 ? 'attention' : '', data: { tenant: t.name, owner: t.owner } },
      el('td', {}, el('a', { href: tenantHref(t), class: 'tenant-link' }, t.name), el('div', {}, labels)),
      el('td', {}, t.owner),
      el('td', {}, badge(t.phase, `phase-${t.phase}`)),
      conditionsCell(t),
      el('td', {}, t.kubernetes_version || t.version),
      el('td', {}, t.plan),
      el('td', { title: when(t.created_at) }, age(t.created_at)),
      el('td', { class: 'mono' }, t.endpoint || '—'),
      el('td', { title: t.usage ? when(t.usage.sampled_at) : '' }, usageSummary(t.usage) || el('span', { class: 'muted' }, 'no sample yet')));
  }

  async function fleetView(main, gen) {
    const count = el('span', { id: 'fleet-count', class: 'muted' }, 'loading…');
    const filter = el('input', { type: 'search', id: 'fleet-filter', placeholder: 'Filter: name, owner, phase, label, reason…', value: fleetState.filter });
    const refresh = el('button', { type: 'button', on: { click: () => route() } }, 'Refresh');
    const box = el('div', { id: 'fleet' });
    main.append(el('h2', {}, 'Fleet'), el('div', { class: 'toolbar' }, filter, refresh, count), box);
    let tenants;
    try {
      tenants = (await api('GET', '/v1/tenants')).items || [];
    } catch (e) {
      if (live(gen)) box.replaceChildren(problemBox(e));
      return;
    }
    if (!live(gen)) return;
    const draw = () => {
      const needle = fleetState.filter.trim().toLowerCase();
      const shown = tenants.filter((t) => !needle || searchable(t).includes(needle));
      const col = FLEET_COLUMNS.find((c) => c[0] === fleetState.sort);
      shown.sort((a, b) => (col
        ? fleetState.dir * compare(col[2](a), col[2](b)) || compare(a.name, b.name)
        : attention(a) - attention(b) || compare(a.name, b.name) || compare(a.owner, b.owner)));
      const failing = tenants.filter((t) => attention(t) < 2).length;
      count.textContent = `${shown.length} of ${tenants.length} tenants; ${failing} need attention`;
      const head = el('tr', {}, FLEET_COLUMNS.map(([key, title]) => el('th', {
        class: `sortable${fleetState.sort === key ? (fleetState.dir > 0 ? ' sorted-asc' : ' sorted-desc') : ''}`,
        data: { sort: key },
        title: 'Sort by this column (again: reverse; a third time: failing first)',
        on: {
          click: () => {
            if (fleetState.sort !== key) { fleetState.sort = key; fleetState.dir = 1; }
            else if (fleetState.dir > 0) fleetState.dir = -1;
            else fleetState.sort = null;
            draw();
          },
        },
      }, title)));
      box.replaceChildren(shown.length
        ? el('table', { id: 'fleet-table' }, el('thead', {}, head), el('tbody', {}, shown.map(fleetRow)))
        : el('p', { class: 'info' }, tenants.length ? 'No tenant matches the filter.' : 'No tenants yet.'));
    };
    filter.addEventListener('input', () => { fleetState.filter = filter.value; draw(); });
    draw();
  }

  // ---- one tenant ------------------------------------------------------------------------

  function section(id, title) {
    const body = el('div', { class: 'section-body' }, el('p', { class: 'muted' }, 'loading…'));
    return { node: el('section', { id }, el('h3', {}, title), body), body };
  }

  async function fill(s, gen, load) {
    try {
      const content = await load();
      if (live(gen)) s.body.replaceChildren(...[content].flat());
    } catch (e) {
      if (live(gen)) s.body.replaceChildren(problemBox(e));
    }
  }

  async function tenantView(main, gen, name, owner) {
    const base = `/v1/tenants/${seg(name)}`;
    const q = (extra) => query({ ...(extra || {}), owner });
    const summary = section('tenant-summary', 'Overview');
    const conditions = section('tenant-conditions', 'Conditions');
    const usage = section('tenant-usage', 'Usage');
    const kubeconfigs = section('tenant-kubeconfigs', 'Kubeconfigs');
    const snapshots = section('tenant-snapshots', 'Snapshots and restores');
    const rotations = section('tenant-rotations', 'Rotations');
    const timeline = section('tenant-timeline', 'Timeline (audit trail)');
    main.append(
      el('h2', {}, 'Tenant ', el('span', { id: 'tenant-name', class: 'mono' }, name), owner ? el('span', { class: 'muted' }, ` of ${owner}`) : ''),
      el('div', { class: 'toolbar' }, el('a', { href: '#/fleet' }, '← Fleet'), el('button', { type: 'button', on: { click: () => route() } }, 'Refresh')),
      summary.node, conditions.node, usage.node, kubeconfigs.node, snapshots.node, rotations.node, timeline.node);

    const tenant = api('GET', `${base}${q()}`);
    fill(summary, gen, async () => tenantFacts(await tenant));
    fill(conditions, gen, async () => conditionsTable(await tenant));
    usageChart(usage, gen, `${base}/usage`, owner);
    const loadTimeline = () => fill(timeline, gen, async () => auditTable(await auditOf(name)));
    // After a revocation both change: the kubeconfig's state, and the trail's new entry.
    const afterRevoke = () => Promise.all([loadKubeconfigs(), loadTimeline()]);
    const loadKubeconfigs = () => fill(kubeconfigs, gen, async () => kubeconfigTable(
      (await api('GET', `${base}/kubeconfigs${q()}`)).items || [], base, owner, kubeconfigs, afterRevoke));
    loadKubeconfigs();
    fill(snapshots, gen, async () => snapshotTables(await api('GET', `${base}/snapshots${q()}`)));
    fill(rotations, gen, async () => rotationTable((await api('GET', `${base}/rotations${q()}`)).items || []));
    loadTimeline();
    // An unknown tenant: every section says so; the first answer is enough to know.
    tenant.catch(() => {});
  }

  function tenantFacts(t) {
    const up = t.upgrade;
    const labels = Object.entries(t.labels || {}).map(([k, v]) => badge(`${k}=${v}`));
    const facts = [
      ['Phase', badge(t.phase, `phase-${t.phase}`)],
      ['Owner', t.owner],
      ['Key', el('span', { class: 'mono' }, t.key)],
      ['Version', `${t.kubernetes_version || '—'} (minor ${t.version})`],
      ['Plan', t.plan],
      ['Endpoint', el('span', { class: 'mono' }, t.endpoint || '—')],
      ['Created', `${when(t.created_at)} (${age(t.created_at)} ago)`],
      ['Labels', labels.length ? labels : el('span', { class: 'muted' }, 'none')],
      ['Sleep', t.sleep],
      ['Fleet upgrades', t.fleet_upgrades],
      ['Automatic updates', t.auto_update_effective],
      ['Last upgrade', up ? `${up.from} → ${up.target}: ${up.state}${up.reason ? ` (${up.reason})` : ''}` : 'none'],
      ['Last usage sample', t.usage ? `${usageSummary(t.usage)} (${when(t.usage.sampled_at)})` : 'none yet'],
    ];
    return el('dl', { class: 'facts' }, facts.map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
  }

  function conditionsTable(t) {
    const rows = (t.conditions || []).map((c) => el('tr', { class: c.status === 'True' ? '' : 'failing', data: { condition: c.type } },
      el('td', {}, c.type),
      el('td', {}, badge(c.status, c.status === 'True' ? 'ok' : c.status === 'False' ? 'bad' : 'warn')),
      el('td', {}, c.reason),
      el('td', { class: 'detail' }, c.message),
      el('td', { title: when(c.last_transition_time) }, `${age(c.last_transition_time)} ago`)));
    if (!rows.length) return el('p', { class: 'muted' }, 'No conditions yet.');
    return table(['Type', 'Status', 'Reason', 'Message', 'Since'], rows);
  }

  // The audit trail of tenants of this name: the API filters by name (every tenant that had
  // it, as `vcp audit --tenant` does), oldest first; shown newest first, at most 10 pages.
  async function auditOf(name) {
    let after;
    const items = [];
    for (let page = 0; page < 10; page++) {
      const p = await api('GET', `/v1/audit${query({ tenant: name, limit: 1000, after })}`);
      items.push(...(p.items || []));
      if (p.next_after === null || p.next_after === undefined) break;
      after = p.next_after;
    }
    return items.reverse();
  }

  function auditTable(items) {
    if (!items.length) return el('p', { class: 'muted' }, 'No audit entries.');
    return table(['When', 'Who', 'What', 'Detail'], items.map((e) => el('tr', { data: { action: e.action } },
      el('td', { title: when(e.at) }, when(e.at)),
      el('td', {}, e.actor),
      el('td', { class: 'mono' }, e.action),
      el('td', { class: 'detail' }, el('code', {}, JSON.stringify(e.detail))))), { id: 'timeline-table' });
  }

  function kubeconfigTable(items, base, owner, sec, reload) {
    if (!items.length) return el('p', { class: 'muted' }, 'No kubeconfigs issued.');
    const now = Date.now();
    const rows = items.slice().reverse().map((k) => {
      const expired = Date.parse(k.expires_at) <= now;
      const state = k.revoked_at ? `revoked ${when(k.revoked_at)}` : expired ? 'expired' : k.break_glass ? 'break-glass (cannot be revoked)' : 'active';
      const canRevoke = !k.revoked_at && !expired && !k.break_glass;
      const button = canRevoke ? el('button', {
        type: 'button',
        class: 'danger revoke',
        data: { serial: k.serial },
        on: { click: (ev) => revoke(ev.currentTarget, k, base, owner, sec, reload) },
      }, 'Revoke') : '';
      return el('tr', { data: { serial: k.serial, user: k.user } },
        el('td', {}, k.user),
        el('td', {}, (k.groups || []).map((g) => badge(g))),
        el('td', { class: 'mono' }, k.serial),
        el('td', {}, k.created_by),
        el('td', {}, when(k.created_at)),
        el('td', {}, when(k.expires_at)),
        el('td', { class: 'kubeconfig-state' }, state),
        el('td', {}, button));
    });
    return table(['User', 'Groups', 'Serial', 'Issued by', 'Issued', 'Expires', 'State', ''], rows, { id: 'kubeconfig-table' });
  }

  async function revoke(button, k, base, owner, sec, reload) {
    const ok = window.confirm(`Revoke the kubeconfig of ${k.user} (serial ${k.serial})? `
      + 'The tenant apiserver refuses it within 60 seconds; this cannot be undone.');
    if (!ok) return;
    button.disabled = true;
    try {
      await api('DELETE', `${base}/kubeconfigs/${seg(k.serial)}${query({ owner })}`);
      await reload();
      sec.body.prepend(el('p', { class: 'notice', role: 'status', id: 'revoke-notice' },
        `Revoked the kubeconfig of ${k.user} (serial ${k.serial}); the tenant apiserver refuses it within 60 seconds.`));
    } catch (e) {
      button.disabled = false;
      sec.body.prepend(problemBox(e));
    }
  }

  function snapshotTables(list) {
    const snaps = list.snapshots || [];
    const restores = list.restores || [];
    const out = [];
    out.push(snaps.length ? table(['Id', 'State', 'Kind', 'Version', 'Size', 'Asked by', 'Taken', 'Reason'], snaps.map((s) => el('tr', {},
      el('td', {}, s.id),
      el('td', {}, badge(s.state, `state-${s.state}`)),
      el('td', {}, s.kind || ''),
      el('td', {}, s.version || ''),
      el('td', {}, s.size_bytes ? bytes(s.size_bytes) : ''),
      el('td', {}, s.requested_by),
      el('td', {}, when(s.finished_at || s.created_at)),
      el('td', { class: 'detail' }, s.reason || '')))) : el('p', { class: 'muted' }, 'No snapshots.'));
    if (restores.length) {
      out.push(table(['Restore', 'From snapshot', 'State', 'Asked by', 'Started', 'Reason'], restores.map((r) => el('tr', {},
        el('td', {}, r.id),
        el('td', {}, r.snapshot),
        el('td', {}, badge(r.state, `state-${r.state}`)),
        el('td', {}, r.requested_by),
        el('td', {}, when(r.started_at)),
        el('td', { class: 'detail' }, r.reason || '')))));
    }
    return out;
  }

  function rotationTable(items) {
    if (!items.length) return el('p', { class: 'muted' }, 'No rotations.');
    return table(['Id', 'Target', 'Phase', 'Since', 'Asked by', 'Started', 'Finished'], items.map((r) => el('tr', {},
      el('td', {}, r.id),
      el('td', {}, r.target),
      el('td', {}, r.phase),
      el('td', {}, when(r.phase_since)),
      el('td', {}, r.requested_by),
      el('td', {}, when(r.created_at)),
      el('td', {}, when(r.finished_at)))));
  }

  // ---- usage over time: an SVG chart drawn here --------------------------------------------

  const RANGES = [['1h', 3600e3], ['24h', 86400e3], ['7d', 7 * 86400e3]];
  const usageState = { resource: 'pods', range: '24h' };

  function usageChart(sec, gen, path, owner) {
    const resource = el('select', { id: 'usage-resource' },
      RESOURCES.map(([k, title]) => el('option', { value: k, selected: k === usageState.resource }, title)));
    const range = el('select', { id: 'usage-range' },
      RANGES.map(([k]) => el('option', { value: k, selected: k === usageState.range }, `last ${k}`)));
    const chartBox = el('div', {}, el('p', { class: 'muted' }, 'loading…'));
    let answer = null;
    const draw = () => {
      if (answer) chartBox.replaceChildren(...chartOf(answer, usageState.resource));
    };
    const load = async () => {
      const ms = RANGES.find(([k]) => k === usageState.range)[1];
      const since = new Date(Date.now() - ms).toISOString();
      try {
        // A week at the default interval is just over one page (10,080 samples): follow the
        // pages, so the newest samples are drawn too (at most five, 50,000 samples).
        const first = await api('GET', `${path}${query({ since, limit: 10000, owner })}`);
        const items = [...(first.items || [])];
        let next = first.next_since;
        for (let page = 1; next && page < 5 && live(gen); page++) {
          const more = await api('GET', `${path}${query({ since: next, until: first.until, limit: 10000, owner })}`);
          items.push(...(more.items || []));
          next = more.next_since;
        }
        if (!live(gen)) return;
        answer = { ...first, items, next_since: next };
        draw();
      } catch (e) {
        if (live(gen)) chartBox.replaceChildren(problemBox(e));
      }
    };
    resource.addEventListener('change', () => { usageState.resource = resource.value; draw(); });
    range.addEventListener('change', () => { usageState.range = range.value; load(); });
    sec.body.replaceChildren(el('div', { class: 'toolbar' }, resource, range), chartBox);
    load();
  }

  // A step chart (a sample holds until the next one) of one resource over the asked range,
  // with the plan's limit dashed when it has one.
  function chartOf(a, key) {
    const [, title, fmt] = RESOURCES.find(([k]) => k === key);
    const items = a.items || [];
    if (!items.length) {
      return [el('p', { class: 'info', id: 'usage-empty' }, 'No samples in this range: a tenant is sampled while it is Ready, every --usage-interval-seconds.')];
    }
    const W = 720;
    const H = 220;
    const L = 70;
    const R = 16;
    const T = 14;
    const B = 34;
    const t0 = Date.parse(a.since);
    const t1 = Math.max(Date.parse(a.until), t0 + 1);
    const limit = a.limits ? a.limits[key] : null;
    const values = items.map((s) => Number(s.used[key] || 0));
    const top = Math.max(1, ...values, limit ?? 0) * 1.1;
    const x = (t) => L + ((Math.min(Math.max(t, t0), t1) - t0) / (t1 - t0)) * (W - L - R);
    const y = (v) => H - B - (v / top) * (H - T - B);
    let d = '';
    items.forEach((s, i) => {
      const xs = x(Date.parse(s.sampled_at));
      const xe = i + 1 < items.length ? x(Date.parse(items[i + 1].sampled_at)) : x(Math.min(Date.now(), t1));
      const yv = y(values[i]);
      d += `${i === 0 ? 'M' : 'L'}${xs.toFixed(1)},${yv.toFixed(1)}H${xe.toFixed(1)}`;
    });
    const chart = svg('svg', { class: 'chart', id: 'usage-chart', viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img' },
      svg('title', {}, `${title} over the last ${usageState.range}`),
      [0, 0.5, 1].map((f) => svg('line', { class: 'grid', x1: L, x2: W - R, y1: y(top * f / 1.1), y2: y(top * f / 1.1) })),
      svg('line', { class: 'axis', x1: L, x2: L, y1: T, y2: H - B }),
      svg('line', { class: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B }),
      [0, 0.5, 1].map((f) => svg('text', { x: L - 6, y: y(top * f / 1.1) + 4, 'text-anchor': 'end' }, fmt(Math.round(top * f / 1.1)))),
      svg('text', { x: L, y: H - 12 }, when(a.since)),
      svg('text', { x: W - R, y: H - 12, 'text-anchor': 'end' }, when(a.until)),
      limit === null || limit === undefined ? null
        : svg('path', { class: 'limit', d: `M${L},${y(limit).toFixed(1)}H${W - R}` }, svg('title', {}, `limit ${fmt(limit)}`)),
      svg('path', { class: 'series', d }));
    const last = items[items.length - 1];
    const more = a.next_since ? ' (the range holds more: the oldest 50,000 samples are drawn)' : '';
    return [chart, el('p', { class: 'muted', id: 'usage-caption' },
      `${items.length} samples; latest ${fmt(values[values.length - 1])} at ${when(last.sampled_at)}`,
      limit === null || limit === undefined ? '; no limit' : `; limit ${fmt(limit)}`, more)];
  }

  // ---- fleet upgrades ----------------------------------------------------------------------

  // Owners may not read fleet upgrades (403): said plainly, and no more polling.
  function upgradeProblem(e) {
    if (e instanceof ApiError && e.status === 403) {
      return el('p', { class: 'info', id: 'upgrades-forbidden' },
        'Fleet upgrades are run by the platform\'s admins: this token is not an admin\'s, so the API does not show them (403). ',
        'Your tenants\' own upgrades are on their pages.');
    }
    return problemBox(e);
  }

  // Calls tick now and again every POLL_MS after each answer (never two at once), while the
  // view is the one shown; a tick that returns false stops.
  function poll(gen, tick) {
    const run = async () => {
      if (!live(gen)) return;
      const again = await tick();
      if (again !== false && live(gen)) setTimeout(run, POLL_MS);
    };
    run();
  }

  function waveText(f) {
    const waves = Math.max(f.waves, 1);
    return `wave ${Math.min(f.current_wave + 1, waves)} of ${f.waves}`;
  }

  function progressText(p) {
    const eta = p.eta_seconds === null || p.eta_seconds === undefined ? '' : `; about ${Math.ceil(p.eta_seconds / 60)} min left`;
    return `${p.succeeded} succeeded, ${p.running} running, ${p.pending} pending, ${p.failed} failed, ${p.skipped} skipped of ${p.total}${eta}`;
  }

  function upgradesView(main, gen) {
    const box = el('div', { id: 'upgrades' }, el('p', { class: 'muted' }, 'loading…'));
    main.append(el('h2', {}, 'Fleet upgrades'), box);
    poll(gen, async () => {
      try {
        const list = (await api('GET', '/v1/upgrades')).items || [];
        if (!live(gen)) return false;
        box.replaceChildren(list.length ? table(
          ['Id', 'State', 'Target', 'Wave', 'Progress', 'Canary', 'Failure budget', 'Created'],
          list.map((f) => el('tr', { data: { upgrade: f.id } },
            el('td', {}, el('a', { href: `#/upgrades/${seg(String(f.id))}` }, `#${f.id}`)),
            el('td', {}, badge(f.state, `state-${f.state}`)),
            el('td', {}, f.target),
            el('td', {}, waveText(f)),
            el('td', {}, el('progress', { max: Math.max(f.progress.total, 1), value: f.progress.succeeded }), ' ', progressText(f.progress)),
            el('td', {}, f.canary),
            el('td', {}, `${f.progress.failed} failed; stops past ${f.failure_budget} in a wave`),
            el('td', {}, `${when(f.created_at)} by ${f.created_by}`))),
          { id: 'upgrades-table' }) : el('p', { class: 'info' }, 'No fleet upgrades.'));
        return true;
      } catch (e) {
        if (!live(gen)) return false;
        box.replaceChildren(upgradeProblem(e));
        // Forbidden or logged out: asking again changes nothing. Anything else may pass.
        return !(e instanceof ApiError && (e.status === 403 || e.status === 401 || e.status === 404));
      }
    });
  }

  function upgradeView(main, gen, id) {
    const path = `/v1/upgrades/${seg(id)}`;
    const summary = el('div', { id: 'upgrade-summary' }, el('p', { class: 'muted' }, 'loading…'));
    const waves = el('div', { id: 'upgrade-waves' });
    const failures = el('div', { id: 'upgrade-failures' });
    const messages = el('div', { id: 'upgrade-messages' });
    // Built once, not at every poll, so a reason being typed survives the refreshes.
    const reason = el('input', { type: 'text', id: 'upgrade-reason', maxlength: 200, placeholder: 'Reason (optional, in the audit trail)' });
    const buttons = {};
    const act = async (action) => {
      if (action === 'cancel' && !window.confirm(`Cancel fleet upgrade #${id}? Tenants not started are skipped; started ones finish.`)) return;
      const r = reason.value.trim();
      for (const b of Object.values(buttons)) b.disabled = true;
      try {
        const f = await api('POST', `${path}/${action}`, r ? { reason: r } : {});
        reason.value = '';
        messages.replaceChildren(el('p', { class: 'notice', role: 'status' }, `Fleet upgrade #${id} is now ${f.state}.`));
      } catch (e) {
        messages.replaceChildren(problemBox(e));
      }
      refresh();
    };
    for (const [action, label] of [['pause', 'Pause'], ['resume', 'Resume'], ['cancel', 'Cancel']]) {
      buttons[action] = el('button', { type: 'button', id: `upgrade-${action}`, class: action === 'cancel' ? 'danger' : '', disabled: true, on: { click: () => act(action) } }, label);
    }
    const actions = el('div', { class: 'toolbar', id: 'upgrade-actions' }, buttons.pause, buttons.resume, buttons.cancel, reason);
    main.append(el('h2', {}, `Fleet upgrade #${id}`),
      el('div', { class: 'toolbar' }, el('a', { href: '#/upgrades' }, '← Fleet upgrades'), el('span', { class: 'muted' }, `refreshed every ${POLL_MS / 1000} s`)),
      summary, actions, messages, waves, failures);

    const draw = (f) => {
      buttons.pause.disabled = f.state !== 'Running';
      buttons.resume.disabled = f.state !== 'Paused';
      buttons.cancel.disabled = !(f.state === 'Running' || f.state === 'Paused');
      const sel = f.selector || {};
      const selector = [sel.labels ? `labels ${sel.labels}` : '', sel.names ? `names ${sel.names.join(', ')}` : '', sel.version ? `version ${sel.version}` : '']
        .filter(Boolean).join('; ') || 'every tenant';
      const facts = [
        ['State', el('span', { id: 'upgrade-state' }, badge(f.state, `state-${f.state}`, f.reason || ''))],
        ['Target', f.target],
        ['Selector', selector],
        ['Wave', el('span', { id: 'wave-counter' }, waveText(f))],
        ['Progress', [el('progress', { max: Math.max(f.progress.total, 1), value: f.progress.succeeded }), ' ', el('span', { id: 'upgrade-progress' }, progressText(f.progress))]],
        ['Canary', `${f.canary} tenant${f.canary === 1 ? '' : 's'} first (wave 1), then waves doubling up to ${f.max_parallel} at once`],
        ['Failure budget', el('span', { id: 'failure-budget' }, `${f.progress.failed} failed so far; it stops when more than ${f.failure_budget} of one wave fail`)],
        ['Soak', `${f.soak_seconds} s after each wave${f.soak_until ? `; next wave not before ${when(f.soak_until)}` : ''}`],
        ['Maintenance windows', f.respect_maintenance_windows ? 'respected' : 'ignored'],
        ['Created', `${when(f.created_at)} by ${f.created_by}`],
        ['Finished', when(f.finished_at)],
        ['Reason', f.reason || '—'],
      ];
      summary.replaceChildren(el('dl', { class: 'facts' }, facts.map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)])));
      const byWave = new Map();
      for (const t of f.tenants || []) {
        if (!byWave.has(t.wave)) byWave.set(t.wave, []);
        byWave.get(t.wave).push(t);
      }
      const blocks = [];
      for (let w = 0; w < Math.max(f.waves, byWave.size); w++) {
        const ts = byWave.get(w) || [];
        const done = ts.length > 0 && ts.every((t) => ['Succeeded', 'Failed', 'Skipped'].includes(t.state));
        const current = w === f.current_wave && (f.state === 'Running' || f.state === 'Paused') && !done;
        const status = done ? 'done' : current ? 'in progress' : w < f.current_wave ? 'started' : 'waiting';
        blocks.push(el('div', { class: `wave${current ? ' current' : ''}`, data: { wave: w } },
          el('h4', {}, `Wave ${w + 1}${w === 0 ? ' (canary)' : ''}: ${ts.length} tenant${ts.length === 1 ? '' : 's'}, ${status}`),
          table(['Tenant', 'Owner', 'From → to', 'State', 'Its upgrade', 'Started', 'Finished', 'Why'], ts.map((t) => el('tr', { data: { tenant: t.name, owner: t.owner || '' } },
            el('td', {}, el('a', { href: tenantHref(t) }, t.name)),
            el('td', {}, t.owner || ''),
            el('td', {}, `${t.from} → ${t.target}`),
            el('td', { class: 'fleet-tenant-state' }, badge(t.state, `state-${t.state}`)),
            el('td', {}, t.upgrade_state || ''),
            el('td', {}, when(t.started_at)),
            el('td', {}, when(t.finished_at)),
            el('td', { class: 'detail' }, [t.forced ? `forced: ${t.forced}` : '', t.reason || ''].filter(Boolean).join('; ')))))));
      }
      waves.replaceChildren(el('h3', {}, 'Waves'), ...blocks);
      const failed = f.failures || [];
      failures.replaceChildren(...(failed.length ? [el('h3', {}, 'Failures'), table(['Tenant', 'Owner', 'Wave', 'Why'], failed.map((t) => el('tr', {},
        el('td', {}, t.name), el('td', {}, t.owner || ''), el('td', {}, t.wave + 1), el('td', { class: 'detail' }, t.reason || ''))))] : []));
    };

    let stopped = false;
    const refresh = async () => {
      try {
        const f = await api('GET', path);
        if (!live(gen)) return false;
        draw(f);
        return true;
      } catch (e) {
        if (!live(gen)) return false;
        summary.replaceChildren(upgradeProblem(e));
        stopped = e instanceof ApiError && [401, 403, 404, 400].includes(e.status);
        if (stopped) actions.hidden = true;
        return !stopped;
      }
    };
    poll(gen, refresh);
  }

  // ---- versions ----------------------------------------------------------------------------

  async function versionsView(main, gen) {
    const box = el('div', { id: 'versions' }, el('p', { class: 'muted' }, 'loading…'));
    main.append(el('h2', {}, 'Versions'), box);
    try {
      const [catalog, tenants] = await Promise.all([api('GET', '/v1/versions'), api('GET', '/v1/tenants')]);
      if (!live(gen)) return;
      const count = new Map();
      for (const t of tenants.items || []) count.set(t.version, (count.get(t.version) || 0) + 1);
      const known = new Set((catalog.versions || []).map((v) => v.minor));
      const rows = (catalog.versions || []).map((v) => el('tr', { data: { minor: v.minor } },
        el('td', {}, v.minor),
        el('td', {}, v.kubernetes),
        el('td', {}, badge(v.class, `class-${v.class}`)),
        el('td', {}, v.default ? 'default' : ''),
        el('td', { class: 'tenant-count' }, count.get(v.minor) || 0)));
      for (const [minor, n] of count) {
        if (!known.has(minor)) {
          rows.push(el('tr', { data: { minor } }, el('td', {}, minor), el('td', { class: 'muted' }, 'not in this server\'s catalog'), el('td', {}), el('td', {}), el('td', { class: 'tenant-count' }, n)));
        }
      }
      box.replaceChildren(table(['Minor', 'Release', 'Class', '', 'Tenants'], rows, { id: 'versions-table' }),
        el('p', { class: 'muted' }, 'preview: new tenants need allow_preview; deprecated: owners should upgrade; expired: no new tenants, and the next fleet upgrade moves tenants off it. Tenants counted are those this token sees.'));
    } catch (e) {
      if (live(gen)) box.replaceChildren(problemBox(e));
    }
  }

  // ---- start -------------------------------------------------------------------------------

  byId('login').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const input = byId('token');
    const token = input.value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    input.value = '';
    // The first view's request checks the token: a 401 comes back here with the reason.
    route();
  });
  byId('logout').addEventListener('click', () => logout('Logged out.'));
  window.addEventListener('hashchange', route);
  route();
})();
