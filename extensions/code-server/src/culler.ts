/**
 * What the extension asks and tells, without VS Code's API (so that it can be run and tested with
 * Node alone): the culler's verdict on this notebook, and the request that code-server counts as
 * activity.
 *
 * Environment of code-server's container (the same as for the JupyterLab extension, set by the
 * PodDefault in docs/ide-extension.md):
 *
 *   KF_CULLER_VERDICT_URL       the culler's verdict API; unset: nothing is shown
 *   NB_PREFIX                   /notebook/<namespace>/<name> (set by Kubeflow), or a Workspace's
 *                               /workspace/connect/<namespace>/<name>/<portId>
 *   KF_CULLER_TOKEN_FILE        a projected ServiceAccount token for the audience kf-culler
 *                               (default /var/run/secrets/kf-culler/token), read at every question
 *   KF_CULLER_POLL_SECONDS      how often to ask (default 30)
 *   KF_CULLER_TIMEOUT_SECONDS   how long one question may take (default 3)
 *   KF_CULLER_CODE_SERVER_URL   code-server itself, for "Keep working" (default http://127.0.0.1:8888/,
 *                               where Kubeflow's code-server images listen)
 */
import * as fs from 'fs';
import * as http from 'http';
import * as https from 'https';

export const TOKEN_FILE = '/var/run/secrets/kf-culler/token';
export const CODE_SERVER_URL = 'http://127.0.0.1:8888/';
const DNS = '[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?';
const PREFIXES: [RegExp, string][] = [
  [new RegExp(`^/?notebook/(${DNS})/(${DNS})/?$`), 'notebooks'],
  [new RegExp(`^/?workspace/connect/(${DNS})/(${DNS})/[^/]+/?$`), 'workspaces']
];
const MAX_REASON = 1000;
const MAX_BODY = 1 << 20;

export interface Verdict {
  available: boolean;
  why?: string;
  state?: string;
  action?: string;
  reason?: string;
  stopAt?: string | null;
  warnAt?: string | null;
  passTime?: string | null;
  extendUntil?: string | null;
  now: string;
  pollSeconds: number;
}

type Env = Record<string, string | undefined>;

function numberEnv(env: Env, name: string, fallback: number, low: number, high: number): number {
  const v = Number(env[name] ?? fallback);
  return Number.isFinite(v) ? Math.min(Math.max(v, low), high) : fallback;
}

export function pollSeconds(env: Env): number {
  return numberEnv(env, 'KF_CULLER_POLL_SECONDS', 30, 1, 3600);
}

function iso(t: Date): string {
  return t.toISOString().replace(/\.\d{3}Z$/, 'Z');
}

/** (namespace, name, the verdict API's resource) from NB_PREFIX. */
export function identity(env: Env): [string, string, string] | null {
  const prefix = (env.NB_PREFIX || '').trim();
  for (const [re, resource] of PREFIXES) {
    const m = re.exec(prefix);
    if (m) {
      return [m[1], m[2], resource];
    }
  }
  return null;
}

interface Answer {
  status: number;
  body: string;
}

function get(url: string, headers: Record<string, string>, timeoutMs: number, body?: string): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const lib = url.startsWith('https:') ? https : http;
    const method = body === undefined ? 'GET' : 'POST';
    const req = lib.request(url, { method, headers: { Connection: 'close', ...headers }, timeout: timeoutMs }, res => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        body += chunk;
        if (body.length > MAX_BODY) {
          req.destroy(new Error('answer too large'));
        }
      });
      res.on('end', () => resolve({ status: res.statusCode || 0, body }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error('timed out')));
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * The culler's latest verdict on this notebook, as the JupyterLab extension's server part relays it:
 * {available: true, state, action, reason, stopAt, warnAt, passTime, now, pollSeconds}, or
 * {available: false, why, now, pollSeconds} whatever goes wrong. Asking the culler is not a request
 * to code-server: it never counts as activity.
 */
export async function askCuller(env: Env = process.env): Promise<Verdict> {
  const base = { now: iso(new Date()), pollSeconds: pollSeconds(env) };
  const unavailable = (why: string): Verdict => ({ available: false, why, ...base });
  const url = (env.KF_CULLER_VERDICT_URL || '').trim().replace(/\/+$/, '');
  if (!url) {
    return unavailable('KF_CULLER_VERDICT_URL is not set');
  }
  const who = identity(env);
  if (!who) {
    return unavailable('NB_PREFIX is neither /notebook/<namespace>/<name> nor a Workspace\'s connect path');
  }
  let token: string;
  try {
    token = fs.readFileSync(env.KF_CULLER_TOKEN_FILE || TOKEN_FILE, 'utf8').trim();
  } catch (err) {
    return unavailable(`no ServiceAccount token: ${(err as NodeJS.ErrnoException).code || err}`);
  }
  const timeout = numberEnv(env, 'KF_CULLER_TIMEOUT_SECONDS', 3, 0.1, 30) * 1000;
  let answer: Answer;
  try {
    answer = await get(`${url}/api/v1/namespaces/${who[0]}/${who[2]}/${who[1]}`,
      { Authorization: `Bearer ${token}`, Accept: 'application/json' }, timeout);
  } catch (err) {
    return unavailable(`the culler cannot be reached: ${(err as Error).message}`);
  }
  if (answer.status !== 200) {
    return unavailable(`the culler answered ${answer.status}`);
  }
  let doc: { verdict?: Record<string, unknown>; passTime?: string };
  try {
    doc = JSON.parse(answer.body);
  } catch (err) {
    return unavailable('the culler\'s answer is not JSON');
  }
  const v = doc && doc.verdict;
  if (!v || typeof v !== 'object') {
    return unavailable('the culler\'s answer has no verdict');
  }
  const text = (x: unknown): string | null => (typeof x === 'string' ? x : null);
  return {
    available: true,
    state: text(v.state) ?? undefined,
    action: text(v.action) ?? undefined,
    reason: String(v.reason ?? '').slice(0, MAX_REASON),
    stopAt: text(v.stopAt),
    warnAt: text(v.warnAt),
    passTime: text(doc.passTime),
    extendUntil: text(v.extendUntil),
    ...base
  };
}

/** Whether a verdict calls for the warning: a warning (or a stop) that is due, with a stop time. */
export function warns(v: Verdict): boolean {
  if (!v.available || !v.stopAt) {
    return false;
  }
  if (v.action === 'warn' || v.action === 'stop') {
    return true;
  }
  return v.action === 'keep' && v.state === 'idle' && !!v.warnAt && Date.parse(v.warnAt) <= Date.parse(v.now);
}

/**
 * "Keep working": one HTTP request to code-server itself. code-server's heartbeat counts every HTTP
 * request except GET /healthz (src/node/routes/index.ts), and the culler reads that heartbeat at its
 * next pass. The connection is closed at once (code-server's minute timer also counts open ones).
 * Resolves with code-server's HTTP status.
 */
export async function keep(env: Env = process.env): Promise<number> {
  const root = (env.KF_CULLER_CODE_SERVER_URL || CODE_SERVER_URL).trim().replace(/\/*$/, '/');
  const answer = await get(`${root}?kf-culler=keep-working`, {}, 10_000);
  return answer.status;
}

/** mm:ss (minutes may pass 59) of a duration in milliseconds, never negative. */
export function countdown(ms: number): string {
  const total = Math.max(0, Math.floor(ms / 1000));
  const m = Math.floor(total / 60);
  const s = total % 60;
  return `${m < 10 ? '0' : ''}${m}:${s < 10 ? '0' : ''}${s}`;
}

export function hhmmUtc(t: Date): string {
  const pad = (n: number) => (n < 10 ? '0' : '') + n;
  return `${pad(t.getUTCHours())}:${pad(t.getUTCMinutes())} UTC`;
}

/**
 * What "Keep for ..." asks for, as the JupyterLab banner computes it: the whole hours (or, under an hour,
 * the minutes) the stop can still be moved by, from the planned stop to `extendUntil`; null when it
 * cannot be moved.
 */
export function extension(v: Verdict): { minutes: number; label: string } | null {
  if (!v.stopAt || !v.extendUntil) {
    return null;
  }
  const room = Math.floor((Date.parse(v.extendUntil) - Date.parse(v.stopAt)) / 60000);
  if (!(room >= 1)) {
    return null;
  }
  if (room >= 60) {
    const hours = Math.floor(room / 60);
    return { minutes: hours * 60, label: `Keep for ${hours} more hour${hours === 1 ? '' : 's'}` };
  }
  return { minutes: room, label: `Keep for ${room} more minute${room === 1 ? '' : 's'}` };
}

/**
 * Asks the culler for more time (docs/verdict-api.md, "Asking for more time"): POST .../extend with
 * {"minutes": N} and the same token as the verdict. ok with the granted keepUntil, or the culler's
 * reason for not granting it.
 */
export async function askExtend(minutes: number, env: Env = process.env):
    Promise<{ ok: boolean; keepUntil?: string; message: string }> {
  const url = (env.KF_CULLER_VERDICT_URL || '').trim().replace(/\/+$/, '');
  const who = identity(env);
  if (!url || !who) {
    return { ok: false, message: 'the culler is not configured' };
  }
  let token: string;
  try {
    token = fs.readFileSync(env.KF_CULLER_TOKEN_FILE || TOKEN_FILE, 'utf8').trim();
  } catch (err) {
    return { ok: false, message: `no ServiceAccount token: ${(err as NodeJS.ErrnoException).code || err}` };
  }
  const timeout = numberEnv(env, 'KF_CULLER_TIMEOUT_SECONDS', 3, 0.1, 30) * 1000;
  let answer: Answer;
  try {
    answer = await get(`${url}/api/v1/namespaces/${who[0]}/${who[2]}/${who[1]}/extend`,
      { Authorization: `Bearer ${token}`, Accept: 'application/json', 'Content-Type': 'application/json' },
      timeout, JSON.stringify({ minutes }));
  } catch (err) {
    return { ok: false, message: `the culler cannot be reached: ${(err as Error).message}` };
  }
  let doc: { keepUntil?: unknown; message?: unknown } = {};
  try {
    doc = JSON.parse(answer.body);
  } catch (err) {
    // not JSON: the status says it
  }
  const message = typeof doc.message === 'string' ? doc.message.slice(0, MAX_REASON) : `the culler answered ${answer.status}`;
  if (answer.status === 200 && typeof doc.keepUntil === 'string') {
    return { ok: true, keepUntil: doc.keepUntil, message };
  }
  return { ok: false, message };
}
