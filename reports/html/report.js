/* report.js - draws the tagalloc report page from the JSON in
 * #tagalloc-data (written by reports/html.c).  Every string from the
 * audited program goes into the page as text (textContent, SVG text nodes,
 * title attributes set through the DOM), never as markup. */
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('tagalloc-data').textContent);
  var S = D.strings;
  var SVGNS = 'http://www.w3.org/2000/svg';

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs) if (Object.prototype.hasOwnProperty.call(attrs, k)) e.setAttribute(k, String(attrs[k]));
    return e;
  }
  function str(i) { return i >= 0 ? S[i] : null; }
  function bytes(n) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0, v = n;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(v < 10 ? 2 : 1) : String(v)) + ' ' + u[i];
  }
  function count(n) { return Number(n).toLocaleString('en-US'); }
  function dur(ns) {
    if (ns < 1e3) return ns + ' ns';
    if (ns < 1e6) return (ns / 1e3).toFixed(1) + ' µs';
    if (ns < 1e9) return (ns / 1e6).toFixed(1) + ' ms';
    return (ns / 1e9).toFixed(2) + ' s';
  }
  function kindClass(k, leak) {
    if (k === 'leak.growth') return 'kind grow';
    return leak ? 'kind leak' : 'kind err';
  }
  /* a kind's class comes from the table of kinds (alloc/kinds.c), through
   * the "leak" flag of each entry of D.kinds, which names every kind shown */
  var leakKind = {};
  D.kinds.forEach(function (k) { leakKind[k.kind] = k.leak; });
  function isLeak(k) { return !!leakKind[k]; }

  /* ---- header ---------------------------------------------------------- */
  var cmd = D.argv ? D.argv.join(' ') : D.processes.map(function (p) { return p.trace || ('pid ' + p.pid); }).join(' ');
  $('cmd').textContent = cmd;
  document.title = 'tagalloc: ' + cmd;
  /* the text report's SUMMARY line: error occurrences plus loss records */
  var nerr = D.errors + D.loss_records;
  [['program', D.argv ? D.argv[0] : '(no command line recorded)'], ['processes', count(D.processes.length)],
   ['duration', dur(D.duration)], ['allocations', count(D.allocs)], ['frees', count(D.frees)],
   ['peak live', bytes(D.peak)], ['findings', count(D.findings)],
   ['errors', count(nerr) + (D.loss_records ? ' (' + count(D.loss_records) + ' loss records)' : '')]].forEach(function (f) {
    var d = el('div');
    d.appendChild(el('dt', null, f[0]));
    d.appendChild(el('dd', null, f[1]));
    $('facts').appendChild(d);
  });
  D.kinds.forEach(function (k) {
    var s = el('span', kindClass(k.kind, k.leak), k.kind + ': ' + count(k.groups) + (k.leak ? ' (' + bytes(k.bytes) + ')' : ''));
    s.setAttribute('data-kind', k.kind);
    $('kinds').appendChild(s);
  });
  D.notes.forEach(function (n) { $('notes').appendChild(el('li', null, n)); });
  $('foot').textContent = 'tagalloc ' + D.version + ' · ' + D.processes.length + ' process(es): ' +
    D.processes.map(function (p) {
      return p.pid + (p.clean_exit === 1 ? ' (exited cleanly)' : p.clean_exit === 0 ? ' (no clean exit)' : '') +
        (p.trace ? ' ' + p.trace : '');
    }).join(', ');

  /* ---- findings --------------------------------------------------------- */
  function frameText(f) {
    var fn = str(f[0]), file = str(f[1]), mod = str(f[3]);
    if (fn) return fn;
    if (mod) return mod.replace(/^.*\//, '') + '+' + f[6];
    return f[4];
  }
  /* The first frame that is no allocator wrapper (f[7], reports/wrappers.c):
   * the table names perl's leaks by their callers, not Perl_safesysmalloc. */
  function topFrame(g) {
    var st = g.stack >= 0 ? D.stacks[g.stack] : null;
    if (!st || !st.length) return '<no stack recorded>';
    var k = 0;
    while (k < st.length - 1 && st[k][7]) k++;
    var f = st[k], file = str(f[1]);
    return frameText(f) + (file ? ' ' + file.replace(/^.*\//, '') + (f[2] ? ':' + f[2] : '') : '');
  }
  var rows = D.findings.map(function (g, i) {
    var st = g.stack >= 0 ? D.stacks[g.stack] : [];
    var hay = [g.kind, g.tag || '', g.slot || '', g.detail || ''];
    (st || []).forEach(function (f) { hay.push(frameText(f), str(f[1]) || '', str(f[3]) || ''); });
    return { g: g, i: i, top: topFrame(g), hay: hay.join('\n').toLowerCase() };
  });
  var kinds = {}, tags = {};
  rows.forEach(function (r) { kinds[r.g.kind] = 1; if (r.g.tag) tags[r.g.tag] = 1; });
  D.kinds.forEach(function (k) {
    if (!kinds[k.kind]) return;
    var o = el('option', null, k.kind); o.value = k.kind; $('f-kind').appendChild(o);
  });
  Object.keys(tags).sort().forEach(function (t) { var o = el('option', null, t); o.value = t; $('f-tag').appendChild(o); });

  var sortKey = null, sortDir = 1, open = {};
  var rank = {};
  D.kinds.forEach(function (k, i) { rank[k.kind] = i; });

  function stackList(idx, title, box) {
    box.appendChild(el('div', 'sect', title));
    var st = idx >= 0 ? D.stacks[idx] : null;
    var ul = el('ol', 'stack');
    if (!st || !st.length) ul.appendChild(el('li', 'mod', '<no stack recorded>'));
    (st || []).forEach(function (f, n) {
      var li = el('li');
      li.appendChild(el('span', 'mod', '#' + n + ' ' + f[4] + ' '));
      li.appendChild(el('span', 'fn', frameText(f)));
      var file = str(f[1]);
      if (file) li.appendChild(el('span', 'loc', ' ' + file + (f[2] ? ':' + f[2] : '')));
      var mod = str(f[3]);
      li.appendChild(el('span', 'mod', ' (' + (mod || '<unknown module>') + ')'));
      if (f[5]) li.appendChild(el('span', 'inl', ' (inlined)'));
      if (f[7]) { li.className = 'wrap'; li.appendChild(el('span', 'inl', ' (allocator wrapper)')); }
      ul.appendChild(li);
    });
    box.appendChild(ul);
  }
  function details(g) {
    var box = el('div', 'details');
    var facts = [];
    facts.push('address ' + g.addr);
    if (g.holder) facts.push('holder ' + g.holder + (g.slot ? ' slot "' + g.slot + '"' : ''));
    else if (g.slot) facts.push('slot "' + g.slot + '"');
    if (g.detail) facts.push(g.detail);
    box.appendChild(el('div', 'muted', facts.join(' · ')));
    var what = g.kind === 'leak.growth' || isLeak(g.kind) ? 'allocated at' : 'at';
    if (g.kind === 'ref.leak') what = 'last acquired at';
    if (g.kind.indexOf('hold.') === 0) what = 'found at';
    if (g.kind === 'ref.underflow' && g.aux_stack >= 0) what = 'the extra release';
    var access = g.kind === 'use.after-free' || g.kind === 'heap.overflow';
    var atFree = access && g.stack >= 0 && g.stack === g.free_stack;
    if (access && g.stack < 0)
      box.appendChild(el('div', 'sect', 'accessed at: not seen (found when the block left the quarantine or at exit; --guard stops at the access)'));
    else
      stackList(g.stack, atFree ? 'found at its free' : access ? 'accessed at' : what, box);
    if (g.aux_stack >= 0)
      stackList(g.aux_stack, g.kind === 'leak.orphan' ? 'orphaned at (the hold replaced or dropped)' :
                g.kind === 'ref.underflow' ? 'the count went below zero at (a later, legitimate release)' : 'hold declared at', box);
    if (g.free_stack >= 0 && !atFree) stackList(g.free_stack, 'freed at', box);
    if (g.alloc_stack >= 0) stackList(g.alloc_stack, 'allocated at', box);
    if (g.sites) {
      box.appendChild(el('div', 'sect', 'references by callsite (each releasing callsite is paired with the acquiring one whose stack shares the most outer frames)'));
      g.sites.forEach(function (s, n) {
        var t = '[' + (n + 1) + '] ' + (s[0] > 0 ? 'acquired ' : 'released ') + s[1];
        if (s[0] < 0 && s[2] >= 0) t += ' (paired with [' + (s[2] + 1) + '])';
        if (s[0] > 0) t += ', balance ' + s[3];
        if (s[4] && s[0] < 0) t += s[2] >= 0 ? ' <== releases more than [' + (s[2] + 1) + '] acquired' : ' <== releases what nothing acquired';
        if (s[4] && s[0] > 0 && g.kind === 'ref.leak') t += ' <== acquired more than its releases';
        stackList(s[5], t, box);
      });
    }
    if (g.history) {
      box.appendChild(el('div', 'sect', 'refcount history (' + g.history.length + ', oldest first)'));
      g.history.forEach(function (h) {
        var t = (h[0] === 0 ? 'init' : (h[0] > 0 ? '+' : '') + h[0]) + ' -> ' + h[1] + ' by thread T' + h[2];
        stackList(h[3], t, box);
      });
    }
    /* ref.underflow: the other objects released too often at the same place */
    (g.others || []).forEach(function (o, n) {
      box.appendChild(el('div', 'sect', 'object ' + (n + 2) + ' of ' + g.groups + ', the same extra release'));
      var sub = { kind: g.kind };
      Object.keys(o).forEach(function (key) { sub[key] = o[key]; });
      box.appendChild(details(sub));
    });
    return box;
  }
  function drawTable() {
    var fk = $('f-kind').value, ft = $('f-tag').value, fx = $('f-text').value.toLowerCase();
    var list = rows.filter(function (r) {
      return (!fk || r.g.kind === fk) && (!ft || r.g.tag === ft) && (!fx || r.hay.indexOf(fx) >= 0);
    });
    if (sortKey) {
      list.sort(function (a, b) {
        var x, y;
        if (sortKey === 'kind') { x = rank[a.g.kind]; y = rank[b.g.kind]; }
        else if (sortKey === 'top') { x = a.top; y = b.top; }
        else if (sortKey === 'tag') { x = a.g.tag || ''; y = b.g.tag || ''; }
        else { x = a.g[sortKey]; y = b.g[sortKey]; }
        if (x < y) return -sortDir;
        if (x > y) return sortDir;
        return a.i - b.i;
      });
    }
    var tb = $('findings').tBodies[0];
    while (tb.firstChild) tb.removeChild(tb.firstChild);
    list.forEach(function (r) {
      var tr = el('tr', 'row');
      tr.setAttribute('data-index', r.i);
      var kc = el('td');
      kc.appendChild(el('span', kindClass(r.g.kind, isLeak(r.g.kind)), r.g.kind));
      tr.appendChild(kc);
      tr.appendChild(el('td', 'num', count(r.g.bytes)));
      tr.appendChild(el('td', 'num', count(r.g.blocks)));
      tr.appendChild(el('td', null, r.g.tag || ''));
      tr.appendChild(el('td', 'top', r.top));
      tr.appendChild(el('td', 'num', r.g.pid));
      tr.addEventListener('click', function () { open[r.i] = !open[r.i]; drawTable(); });
      tb.appendChild(tr);
      if (open[r.i]) {
        var more = el('tr', 'more'), td = el('td');
        td.colSpan = 6;
        td.appendChild(details(r.g));
        more.appendChild(td);
        tb.appendChild(more);
      }
    });
    $('f-count').textContent = list.length + ' of ' + rows.length + ' group(s)';
    $('f-none').hidden = rows.length > 0;
    $('findings').hidden = rows.length === 0;
  }
  Array.prototype.forEach.call(document.querySelectorAll('#findings th'), function (th) {
    th.addEventListener('click', function () {
      var k = th.getAttribute('data-key');
      if (sortKey === k) sortDir = -sortDir;
      else { sortKey = k; sortDir = (k === 'bytes' || k === 'blocks') ? -1 : 1; }
      Array.prototype.forEach.call(document.querySelectorAll('#findings th'), function (o) { o.className = o.className.replace(/ ?(asc|desc)/, ''); });
      th.className += sortDir > 0 ? ' asc' : ' desc';
      drawTable();
    });
  });
  ['f-kind', 'f-tag'].forEach(function (id) { $(id).addEventListener('change', drawTable); });
  $('f-text').addEventListener('input', drawTable);
  drawTable();

  /* ---- timeline ---------------------------------------------------------- */
  var COLORS = ['#2f6fdb', '#d9534f', '#2a9d5c', '#e08a00', '#7b4fd6', '#0097a7', '#c2185b', '#6d8b00',
                '#5d4037', '#455a64', '#f06292', '#00897b'];
  var T = D.timeline, series = T.series, multi = D.processes.length > 1;
  var shown = series.map(function () { return true; });
  /* A series' name, with its process when there are several: its program
   * and pid, and the image's number when one pid ran the same program
   * twice (exec). */
  var labels = series.map(function (s) {
    var p = D.processes[s.proc];
    return s.name + (multi ? ' (' + (p && p.program ? p.program + ', ' : '') + 'pid ' + s.pid + ')' : '');
  });
  var seen = {};
  labels.forEach(function (l) { seen[l] = (seen[l] || 0) + 1; });
  function image(s) {   /* 1 for a pid's first process image, 2 after its exec, ... */
    var n = 0;
    for (var k = 0; k <= s.proc; k++) if (D.processes[k].pid === s.pid) n++;
    return n;
  }
  labels = labels.map(function (l, i) { return seen[l] > 1 ? l.replace(/\)$/, ', image ' + image(series[i]) + ')') : l; });
  function label(s) { return labels[series.indexOf(s)]; }
  /* The scale: bytes (every series on one axis from 0), or each series
   * over its own range (lowest to highest), where a large steady part (a
   * dataset loaded once) would flatten what changes step by step.  The
   * page opens on the second when the highest values of a series never
   * drop below half its peak; the tip always says bytes. */
  var lo = series.map(function (s) {
    var v = s.lo && s.lo.length ? s.lo : s.y;
    return v.length ? Math.min.apply(null, v) : 0;
  });
  var hi = series.map(function (s) { return s.y.length ? Math.max.apply(null, s.y) : 0; });
  var own = series.some(function (s, i) { return hi[i] > 0 && Math.min.apply(null, s.y) > hi[i] / 2; });
  function drawTimeline() {
    var box = $('timeline');
    while (box.firstChild) box.removeChild(box.firstChild);
    $('tl-abs').className = own ? '' : 'on';
    $('tl-own').className = own ? 'on' : '';
    $('tl-scale-note').textContent = own ? 'each line spans its own lowest (bottom) to highest (top) value' : '';
    if (!series.length) { $('tl-none').hidden = false; return; }
    var W = 1000, H = 320, L = 70, R = 16, TOP = 12, B = 28;
    var xmax = Math.max(1, T.duration), ymax = 1;
    series.forEach(function (s, i) {
      if (!shown[i]) return;
      s.x.forEach(function (x) { if (x > xmax) xmax = x; });
      s.y.forEach(function (y) { if (y > ymax) ymax = y; });
    });
    function X(x) { return L + (W - L - R) * x / xmax; }
    function Y(y) { return TOP + (H - TOP - B) * (1 - y / ymax); }
    /* a value of series i where it is drawn */
    function SY(i, y) {
      if (!own) return Y(y);
      var span = hi[i] - lo[i];
      return TOP + (H - TOP - B) * (span > 0 ? 1 - (y - lo[i]) / span : 0.5);
    }
    var g = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none', role: 'img' });
    for (var t = 0; t <= 4; t++) {
      var yv = ymax * t / 4;
      g.appendChild(svg('line', { x1: L, x2: W - R, y1: Y(yv), y2: Y(yv), 'class': 'grid' }));
      var tx = svg('text', { x: L - 6, y: Y(yv) + 4, 'text-anchor': 'end' });
      tx.textContent = own ? (25 * t) + '%' : bytes(Math.round(yv));
      g.appendChild(tx);
      var xv = xmax * t / 4, tt = svg('text', { x: X(xv), y: H - 8, 'text-anchor': t === 0 ? 'start' : t === 4 ? 'end' : 'middle' });
      tt.textContent = dur(Math.round(xv));
      g.appendChild(tt);
    }
    g.appendChild(svg('line', { x1: L, x2: L, y1: TOP, y2: H - B, 'class': 'axis' }));
    g.appendChild(svg('line', { x1: L, x2: W - R, y1: H - B, y2: H - B, 'class': 'axis' }));
    T.marks.forEach(function (m) {
      var ln = svg('line', { x1: X(m[1]), x2: X(m[1]), y1: TOP, y2: H - B, 'class': 'mark' });
      var ti = svg('title', {});
      ti.textContent = 'mark ' + m[2] + (multi ? ' (pid ' + m[0] + ')' : '') + ' at ' + dur(m[1]);
      ln.appendChild(ti);
      g.appendChild(ln);
    });
    /* under each line, a band down to the lowest value of each interval:
     * a point stands for many events (steps), the band for what they did */
    series.forEach(function (s, i) {
      if (!shown[i] || !s.lo) return;
      var band = [];
      for (var k = 0; k < s.x.length; k++) band.push(X(s.x[k]).toFixed(1) + ',' + SY(i, s.y[k]).toFixed(1));
      for (var k2 = s.x.length - 1; k2 >= 0; k2--) band.push(X(s.x[k2]).toFixed(1) + ',' + SY(i, s.lo[k2]).toFixed(1));
      var pg = svg('polygon', { points: band.join(' '), fill: COLORS[i % COLORS.length], 'class': 'band' });
      pg.setAttribute('data-series', i);
      g.appendChild(pg);
    });
    series.forEach(function (s, i) {
      if (!shown[i]) return;
      var pts = [];
      for (var k = 0; k < s.x.length; k++) pts.push(X(s.x[k]).toFixed(1) + ',' + SY(i, s.y[k]).toFixed(1));
      var pl = svg('polyline', { points: pts.join(' '), stroke: COLORS[i % COLORS.length] });
      pl.setAttribute('data-series', i);
      if (s.device) pl.setAttribute('stroke-dasharray', '6 3');   /* device memory: dashed */
      g.appendChild(pl);
    });
    if (T.peak) {
      var pi = -1;   /* the peak is on its process's total series */
      series.forEach(function (s, i) { if (pi < 0 && s.total && s.pid === T.peak.pid) pi = i; });
      var px = X(T.peak.x), py = pi >= 0 && shown[pi] ? SY(pi, T.peak.y) : Y(T.peak.y);
      var c = svg('circle', { cx: px, cy: py, r: 4, fill: '#d9534f', 'class': 'peak' });
      g.appendChild(c);
      /* beside the marker, never on it: to its right (left near the right
       * edge), above it (below near the top) */
      var right = px < W - R - 220, above = py - 12 > TOP + 12;
      var pt = svg('text', { x: right ? px + 10 : px - 10, y: above ? py - 10 : py + 20,
                             'text-anchor': right ? 'start' : 'end', 'class': 'peak-label' });
      pt.textContent = 'peak ' + bytes(T.peak.y) + (multi ? ' (pid ' + T.peak.pid + ')' : '');
      g.appendChild(pt);
    }
    var cursor = svg('line', { x1: 0, x2: 0, y1: TOP, y2: H - B, 'class': 'cursor', visibility: 'hidden' });
    g.appendChild(cursor);
    var tip = $('tl-tip');
    g.addEventListener('mousemove', function (ev) {
      var r = g.getBoundingClientRect();
      var vx = (ev.clientX - r.left) * W / r.width;
      var x = (vx - L) / (W - L - R) * xmax;
      if (x < 0 || x > xmax) { cursor.setAttribute('visibility', 'hidden'); tip.hidden = true; return; }
      cursor.setAttribute('x1', vx); cursor.setAttribute('x2', vx); cursor.setAttribute('visibility', 'visible');
      var lines = [dur(Math.round(x))];
      series.forEach(function (s, i) {
        if (!shown[i] || !s.x.length) return;
        var lo = 0, hi = s.x.length - 1;
        while (lo < hi) { var mid = (lo + hi) >> 1; if (s.x[mid] < x) lo = mid + 1; else hi = mid; }
        lines.push(label(s) + ': ' + bytes(s.y[lo]));
      });
      tip.textContent = lines.join('\n');
      tip.hidden = false;
      tip.style.left = (ev.clientX + 14) + 'px';
      tip.style.top = (ev.clientY + 10) + 'px';
    });
    g.addEventListener('mouseleave', function () { cursor.setAttribute('visibility', 'hidden'); tip.hidden = true; });
    box.appendChild(g);
  }
  series.forEach(function (s, i) {
    var lab = el('label'), cb = el('input');
    cb.type = 'checkbox';
    cb.checked = shown[i];
    cb.addEventListener('change', function () { shown[i] = cb.checked; drawTimeline(); });
    var sw = el('span', 'sw');
    sw.style.background = COLORS[i % COLORS.length];
    lab.appendChild(cb);
    lab.appendChild(sw);
    lab.appendChild(document.createTextNode(label(s)));
    $('tl-legend').appendChild(lab);
  });
  $('tl-abs').addEventListener('click', function () { own = false; drawTimeline(); });
  $('tl-own').addEventListener('click', function () { own = true; drawTimeline(); });
  drawTimeline();

  /* what was live at the peak, by tag */
  if (T.peak && T.peak.tags && T.peak.tags.length) {
    var box = $('tl-peak'), tb = el('table'), top = T.peak.tags[0][1] || 1;
    box.appendChild(el('div', null, 'Live at the peak (' + bytes(T.peak.y) + (multi ? ', pid ' + T.peak.pid : '') +
                                     ', at ' + dur(T.peak.x) + '), by tag:'));
    T.peak.tags.forEach(function (t) {
      var tr = el('tr');
      tr.appendChild(el('td', null, t[0]));
      tr.appendChild(el('td', 'num', bytes(t[1])));
      var bar = el('span', 'bar');
      bar.style.width = Math.max(1, Math.round(200 * t[1] / top)) + 'px';
      var td = el('td');
      td.appendChild(bar);
      tr.appendChild(td);
      tb.appendChild(tr);
    });
    box.appendChild(tb);
    box.hidden = false;
  }

  /* ---- flame graphs (icicle: the root on top) ------------------------------ */
  var which = 'leaked', zoom = null;
  function hue(name) {
    var h = 0;
    for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return 'hsl(' + (20 + h % 40) + ',' + (70 + h % 20) + '%,' + (62 + (h >> 8) % 14) + '%)';
  }
  function drawFlame() {
    var root = D.flame[which], box = $('flame');
    while (box.firstChild) box.removeChild(box.firstChild);
    $('fl-leaked').className = which === 'leaked' ? 'on' : '';
    $('fl-peak').className = which === 'peak' ? 'on' : '';
    if (!root || !root[1]) {
      box.style.height = '40px';
      $('fl-info').textContent = which === 'leaked' ? 'Nothing leaked.' : 'No live bytes at the peak (no trace with allocations).';
      return;
    }
    var path = zoom && zoom.which === which ? zoom.path : [root];
    var top = path[path.length - 1], total = root[1], maxDepth = 0, ROW = 18;
    var width = box.clientWidth || 1000;
    function node(n, depth, x, w, anc) {
      var name = S[n[0]];
      var d = el('div', 'node' + (anc ? ' anc' : ''), name);
      d.style.left = (x * 100) + '%';
      d.style.width = (w * 100) + '%';
      d.style.top = (depth * ROW) + 'px';
      d.style.background = hue(name);
      d.title = name + '\n' + bytes(n[1]) + ' (' + (100 * n[1] / total).toFixed(1) + '%)';
      d.addEventListener('click', function (ev) {
        ev.stopPropagation();
        var np = anc ? path.slice(0, path.indexOf(n) + 1) : (n === top ? path : pathTo(n));
        zoom = { which: which, path: np };
        drawFlame();
      });
      d.addEventListener('mouseenter', function () { $('fl-info').textContent = d.title.replace('\n', ' · '); });
      box.appendChild(d);
      if (depth > maxDepth) maxDepth = depth;
    }
    function pathTo(target) {
      var out = null;
      (function walk(n, acc) {
        if (out) return;
        acc.push(n);
        if (n === target) { out = acc.slice(); return; }
        (n[2] || []).forEach(function (c) { walk(c, acc); });
        acc.pop();
      })(top, path.slice(0, -1));
      return out || path;
    }
    for (var i = 0; i < path.length - 1; i++) node(path[i], i, 0, 1, true);
    (function draw(n, depth, x, w) {
      node(n, depth, x, w, false);
      var cx = x;
      (n[2] || []).forEach(function (c) {
        var cw = w * c[1] / n[1];
        if (cw * width >= 1) draw(c, depth + 1, cx, cw);
        cx += cw;
      });
    })(top, path.length - 1, 0, 1);
    box.style.height = ((maxDepth + 1) * ROW + 2) + 'px';
    $('fl-info').textContent = S[top[0]] + ' · ' + bytes(top[1]) + ' (' + (100 * top[1] / total).toFixed(1) + '% of ' + bytes(total) + ')';
  }
  $('fl-leaked').addEventListener('click', function () { which = 'leaked'; drawFlame(); });
  $('fl-peak').addEventListener('click', function () { which = 'peak'; drawFlame(); });
  $('fl-reset').addEventListener('click', function () { zoom = null; drawFlame(); });
  /* leaked bytes first only when something leaked; else the bytes at the peak */
  var leaked = D.kinds.some(function (k) { return k.leak && k.kind !== 'unclassified' && k.bytes > 0; });
  if (!leaked || !D.flame.leaked[1]) which = 'peak';
  drawFlame();
  window.addEventListener('resize', function () { drawFlame(); });
  document.body.setAttribute('data-ready', '1');
})();
