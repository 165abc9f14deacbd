// check_report.js - opens a tagalloc HTML report in headless Chromium and
// checks it (tests/browser/run.sh):
//   node check_report.js PAGE SCREENSHOT ROWS FUNCTION [--xss] [--cmd PROGRAM] [--top TEXT] [--demo]
//                        [--marks N]
// ROWS: the findings rows expected (a number, or "data": as many as the
// page's embedded findings); FUNCTION: text to filter the table by, which
// the first remaining row's expanded stack must show.  --xss: nothing the program controlled may have become markup
// or run (no <img> in the document, no dialog, no data-pwned), and the
// strings must be on the page as text.  --cmd: the header's program must be
// PROGRAM; --top: the row filtered by FUNCTION must show TEXT as its top
// frame (allocator wrappers passed over).  Every page: the peak's label
// does not overlap its marker, the legend's names are all different, and
// the flame graph opens on leaked bytes only when something leaked.
// --demo: the page of `make demo` (a mark per training step drawn, the
// steps not flattened by the dataset, what was live at the peak by tag).
// --marks N: a page a program rendered in the process (train-lenet --html):
// its timeline from the ledger's samples, N marks drawn, a duration, what
// was live at the peak by tag; no stacks of allocations, so no flame graph.
// Exits 1 with one line per failure.
'use strict';
const path = require('path');
const fs = require('fs');
const os = require('os');
const { chromium } = require('playwright-core');

const [page_path, shot, rows_arg, fn, ...flags] = process.argv.slice(2);
const xss = flags.includes('--xss');
const opt = name => (flags.indexOf(name) >= 0 ? flags[flags.indexOf(name) + 1] : undefined);
const want_cmd = opt('--cmd'), want_top = opt('--top'), demo = flags.includes('--demo');
const want_marks = opt('--marks') === undefined ? undefined : Number(opt('--marks'));
const failures = [];
function check(ok, what) {
  if (!ok) failures.push(what);
  console.log((ok ? 'ok   ' : 'FAIL ') + what);
}

(async () => {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'tagalloc-chromium-'));
  const ctx = await chromium.launchPersistentContext(profile, {
    executablePath: '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-background-networking',
           '--disable-component-update', '--disable-sync'],
    viewport: { width: 1400, height: 1000 },
  });
  try {
    const page = ctx.pages()[0] || await ctx.newPage();
    const errors = [], dialogs = [], requests = [];
    page.on('pageerror', e => errors.push(String(e)));
    page.on('console', m => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('dialog', d => { dialogs.push(d.message()); d.dismiss(); });
    page.on('request', r => { if (!r.url().startsWith('file:') && !r.url().startsWith('data:')) requests.push(r.url()); });
    const t0 = Date.now();
    await page.goto('file://' + path.resolve(page_path));
    await page.waitForSelector('body[data-ready="1"]', { timeout: 10000 });
    const ms = Date.now() - t0;
    console.log(`     page ready in ${ms} ms`);
    check(errors.length === 0, `no script errors (${errors.join(' | ')})`);
    check(requests.length === 0, `no network requests (${requests.join(' ')})`);

    const data = await page.evaluate(() => JSON.parse(document.getElementById('tagalloc-data').textContent));
    const want = rows_arg === 'data' ? data.findings.length : Number(rows_arg);
    const nrows = await page.locator('#findings tbody tr.row').count();
    if (want === 0) {   // nothing found: the table says so
      check(nrows === 0 && await page.locator('#f-none').isVisible(), `no findings: the table is empty and says so (${nrows} rows)`);
    } else {
      check(nrows === want, `findings table has ${want} rows (got ${nrows})`);

      // sort by bytes, then filter by kind, then back
      await page.click('#findings th[data-key="bytes"]');
      const first_bytes = await page.locator('#findings tbody tr.row td.num').first().textContent();
      const max_bytes = Math.max(...data.findings.map(f => f.bytes));
      check(first_bytes.replace(/,/g, '') === String(max_bytes), `sorted by bytes: first row ${first_bytes}, largest ${max_bytes}`);
      const kind = data.findings[0].kind;
      await page.selectOption('#f-kind', kind);
      const nkind = await page.locator('#findings tbody tr.row').count();
      check(nkind === data.findings.filter(f => f.kind === kind).length, `filter by kind ${kind}: ${nkind} rows`);
      await page.selectOption('#f-kind', '');

      // filter by text, then expand the first row: its stack
      await page.click('#findings th[data-key="kind"]');
      await page.fill('#f-text', fn);
      const nfn = await page.locator('#findings tbody tr.row').count();
      check(nfn > 0 && nfn <= nrows, `filter by text ${fn}: ${nfn} rows`);
      if (want_top !== undefined) {
        const top = await page.locator('#findings tbody tr.row td.top').first().textContent();
        check(top.startsWith(want_top), `the top frame passes over allocator wrappers: "${top}" starts with "${want_top}"`);
      }
      await page.locator('#findings tbody tr.row').first().click();
      const frames = await page.locator('#findings tr.more .stack li').count();
      check(frames > 0, `the expanded row shows stack frames (${frames})`);
      const stack_text = await page.locator('#findings tr.more').first().textContent();
      check(stack_text.includes(fn), `the expanded stack names ${fn}`);
      await page.fill('#f-text', '');
    }

    // timeline: polylines with points, the peak marked
    const lines = await page.locator('#timeline svg polyline').count();
    const points = await page.locator('#timeline svg polyline').first().getAttribute('points');
    check(lines > 0 && points && points.split(' ').length >= 2, `timeline draws ${lines} series`);
    check(await page.locator('#timeline svg circle.peak').count() === 1, 'timeline marks the peak');
    const pc = await page.locator('#timeline svg circle.peak').boundingBox();
    const pl = await page.locator('#timeline svg text.peak-label').boundingBox();
    const overlap = pc && pl && pc.x < pl.x + pl.width && pl.x < pc.x + pc.width &&
                    pc.y < pl.y + pl.height && pl.y < pc.y + pc.height;
    check(pc && pl && !overlap, `the peak label is beside its marker, not on it (${JSON.stringify(pc)} ${JSON.stringify(pl)})`);
    const legend = await page.locator('#tl-legend label').allTextContents();
    check(new Set(legend).size === legend.length, `the legend names each series once (${legend.join(' | ')})`);
    await page.locator('#timeline svg').scrollIntoViewIfNeeded();   // a long table pushes it below the fold
    const box = await page.locator('#timeline svg').boundingBox();
    await page.mouse.move(box.x + box.width * 0.6, box.y + box.height * 0.5);
    const tip = await page.locator('#tl-tip').textContent();
    check(await page.locator('#tl-tip').isVisible() && /B/.test(tip), 'hovering the timeline shows values');

    if (demo) {
      const marks = await page.locator('#timeline svg line.mark').count();
      check(data.timeline.marks.length >= 100 && marks === data.timeline.marks.length,
            `a mark per training step: ${marks} drawn of ${data.timeline.marks.length}`);
      check(await page.locator('#tl-own').getAttribute('class') === 'on',
            'the timeline opens with each series over its own range (the dataset does not flatten the steps)');
      // every series that changes spans the chart's height: none is flattened by a larger one
      let spans = 0, changing = 0;
      for (let i = 0; i < data.timeline.series.length; i++) {
        const y = data.timeline.series[i].y.concat(data.timeline.series[i].lo);
        if (Math.min(...y) === Math.max(...y)) continue;
        changing++;
        // the line (the highest of each interval) and its band (down to the lowest)
        const ys = (await page.locator(`#timeline svg polygon[data-series="${i}"]`).getAttribute('points'))
          .split(' ').map(p => Number(p.split(',')[1]));
        if (Math.max(...ys) - Math.min(...ys) > 250) spans++;
      }
      check(changing > 3 && spans === changing, `each changing series spans the chart (${spans} of ${changing})`);
      const rows = await page.locator('#tl-peak tr').allTextContents();
      const sum = data.timeline.peak.tags.reduce((a, t) => a + t[1], 0);
      check(rows.length > 3 && rows[0].startsWith('tensor.storage') && sum === data.timeline.peak.y,
            `live at the peak by tag: ${rows.length} tags, ${rows[0]} first, adding up to the peak (${sum} = ${data.timeline.peak.y})`);
      const facts = await page.locator('#facts div').allTextContents();
      check(!facts.includes('duration0 ns') && await page.locator('#tl-none').isHidden(), `a duration and a timeline (${facts[2]})`);
    }

    if (want_marks !== undefined) {
      const marks = await page.locator('#timeline svg line.mark').count();
      check(data.timeline.marks.length === want_marks && marks === want_marks,
            `a mark per training step: ${marks} drawn of ${data.timeline.marks.length}, ${want_marks} expected`);
      const facts = await page.locator('#facts div').allTextContents();
      check(!facts.includes('duration0 ns') && data.timeline.duration > 0 && await page.locator('#tl-none').isHidden(),
            `a duration and a timeline (${facts[2]})`);
      const rows = await page.locator('#tl-peak tr').allTextContents();
      const sum = data.timeline.peak.tags.reduce((a, t) => a + t[1], 0);
      check(rows.length > 3 && sum === data.timeline.peak.y,
            `live at the peak by tag: ${rows.length} tags, adding up to the peak (${sum} = ${data.timeline.peak.y})`);
    }

    // the flame graph opens on leaked bytes only when something leaked
    const leaked = data.kinds.some(k => k.leak && k.kind !== 'unclassified' && k.bytes > 0);
    const on = await page.locator(leaked ? '#fl-leaked' : '#fl-peak').getAttribute('class');
    check(on === 'on', `the flame graph opens on ${leaked ? 'leaked bytes' : 'the bytes live at the peak'}`);
    if (want_cmd !== undefined) {
      const facts = await page.locator('#facts div').allTextContents();
      check(facts.includes('program' + want_cmd), `the header names the program ${want_cmd} (${facts[0]})`);
    }

    // flame graph: nodes, click to zoom (a page rendered in the process has no stacks of allocations)
    if (want_marks === undefined) {
      const nodes = await page.locator('#flame .node').count();
      check(nodes > 1, `the flame graph draws ${nodes} nodes`);
      const deepest = page.locator('#flame .node').last();
      const before = await page.locator('#fl-info').textContent();
      await deepest.click();
      const after = await page.locator('#fl-info').textContent();
      check(after !== before && await page.locator('#flame .node.anc').count() > 0, 'clicking a frame zooms in');
      await page.click('#fl-peak');
      check(await page.locator('#flame .node').count() > 1, 'the flame graph of live bytes at the peak draws');
      await page.click('#fl-leaked');
    }

    if (xss) {
      const pwned = await page.evaluate(() => document.body.dataset.pwned);
      const imgs = await page.locator('img').count();
      check(pwned === undefined && imgs === 0 && dialogs.length === 0,
            `nothing the program controls ran or became markup (img: ${imgs}, dialogs: ${dialogs.length}, pwned: ${pwned})`);
      const text = await page.evaluate(() => document.body.innerText);
      check(text.includes('<img src=x onerror='), 'the HTML-like strings are shown as text');
    }
    await page.screenshot({ path: shot, fullPage: true });
    check(fs.statSync(shot).size > 10000, `screenshot ${shot}`);
  } finally {
    await ctx.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  if (failures.length) {
    console.log(`${failures.length} check(s) failed`);
    process.exit(1);
  }
})().catch(e => { console.log('FAIL ' + e.message.split('\n')[0]); process.exit(1); });
