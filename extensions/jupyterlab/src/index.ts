/**
 * kf-culler in JupyterLab: while the culler warns that this notebook will be stopped, a banner in
 * JupyterLab's header area (above the menu bar, which it moves down rather than covers) says why,
 * counts down to the stop and offers "Keep working" and "Dismiss".
 *
 * The page polls <base>kf-culler/verdict (a server route that never counts as activity) every
 * `pollSeconds` (30 unless the server says otherwise) and shows nothing while the culler is far from a
 * stop or cannot be reached. "Keep working" posts <base>kf-culler/keep, which counts as activity; the
 * banner then stays hidden until a verdict from a later culler pass still says "warn". "Dismiss" hides
 * it for this warning (this stop time); a warning with another stop time shows it again. When the verdict
 * says the stop can still be moved (`extendUntil`, the admin's bound), "Keep for N more hours" posts
 * <base>kf-culler/extend, and the culler writes keep-until itself; the banner says until when.
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

export interface IVerdict {
  available: boolean;
  state?: string;
  action?: string;
  reason?: string;
  stopAt?: string | null;
  warnAt?: string | null;
  extendUntil?: string | null;
  passTime?: string | null;
  now: string;
  pollSeconds?: number;
}

const DEFAULT_POLL_SECONDS = 30;

/** mm:ss (minutes may pass 59) of a duration in milliseconds, never negative. */
export function countdown(ms: number): string {
  const total = Math.max(0, Math.floor(ms / 1000));
  const m = Math.floor(total / 60);
  const s = total % 60;
  return `${m < 10 ? '0' : ''}${m}:${s < 10 ? '0' : ''}${s}`;
}

/**
 * What the extend button asks for: the whole hours (or, under an hour, the minutes) the stop can still be
 * moved by, from the planned stop to `extendUntil`; null when it cannot be moved.
 */
export function extension(v: IVerdict): { minutes: number; label: string } | null {
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

function hhmmUtc(t: Date): string {
  const pad = (n: number) => (n < 10 ? '0' : '') + n;
  return `${pad(t.getUTCHours())}:${pad(t.getUTCMinutes())} UTC`;
}

/** Whether a verdict calls for the banner: a warning (or a stop) that is due, with a stop time. */
export function warns(v: IVerdict): boolean {
  if (!v.available || !v.stopAt) {
    return false;
  }
  if (v.action === 'warn' || v.action === 'stop') {
    return true;
  }
  // "keep" with a warning time already past (the culler warns at its next pass)
  return v.action === 'keep' && v.state === 'idle' && !!v.warnAt && Date.parse(v.warnAt) <= Date.parse(v.now);
}

/**
 * The banner: a widget of JupyterLab's header area, a full-width strip above the menu bar. The shell
 * lays that area out (Lumino's BoxLayout, absolutely positioned children), so the banner's height is
 * its CSS min-height: it is set from the height its content needs whenever the content or the window's
 * width changes, and the layout above it is asked to fit again.
 */
class Banner extends Widget {
  private _content: HTMLElement;
  private _reason: HTMLElement;
  private _stop: HTMLElement;
  private _left: HTMLElement;
  private _button: HTMLButtonElement;
  private _extend: HTMLButtonElement;
  private _note: HTMLElement;
  private _minutes = 0;
  private _dismiss: HTMLButtonElement;
  private _stopAt = 0;
  private _offset = 0; // server clock minus this browser's clock, in ms
  private _timer = 0;
  private _onResize = () => this._fitHeight();

  constructor(onKeep: () => void, onDismiss: () => void, onExtend: (minutes: number) => void) {
    super();
    this.id = 'kf-culler-banner';
    this.addClass('kf-culler-banner');
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'Idle stop warning');
    this._content = document.createElement('div');
    this._content.className = 'kf-culler-banner-content';
    const text = document.createElement('div');
    text.className = 'kf-culler-banner-text';
    text.setAttribute('role', 'alert');
    const title = document.createElement('strong');
    title.textContent = 'This notebook server will be stopped soon. ';
    this._reason = document.createElement('span');
    this._reason.className = 'kf-culler-reason';
    text.append(title, this._reason);
    const when = document.createElement('div');
    when.className = 'kf-culler-banner-when';
    this._stop = document.createElement('span');
    this._stop.className = 'kf-culler-stop-time';
    this._left = document.createElement('span');
    this._left.className = 'kf-culler-countdown';
    this._left.setAttribute('aria-live', 'off');
    when.append('Stops at ', this._stop, ' — in ', this._left);
    this._button = document.createElement('button');
    this._button.type = 'button';
    this._button.className = 'jp-mod-styled jp-mod-accept kf-culler-keep';
    this._button.textContent = 'Keep working';
    this._button.onclick = () => onKeep();
    this._extend = document.createElement('button');
    this._extend.type = 'button';
    this._extend.className = 'jp-mod-styled jp-mod-accept kf-culler-extend';
    this._extend.onclick = () => onExtend(this._minutes);
    this._note = document.createElement('div');
    this._note.className = 'kf-culler-banner-note';
    this._note.setAttribute('role', 'status');
    this._dismiss = document.createElement('button');
    this._dismiss.type = 'button';
    this._dismiss.className = 'jp-mod-styled jp-mod-reject kf-culler-dismiss';
    this._dismiss.textContent = 'Dismiss';
    this._dismiss.title = 'Hide this warning until the next one';
    this._dismiss.onclick = () => onDismiss();
    this._content.append(text, when, this._button, this._extend, this._dismiss, this._note);
    this.node.append(this._content);
  }

  show_(v: IVerdict, receivedAt: number): void {
    this._reason.textContent = v.reason || '';
    this._stopAt = Date.parse(v.stopAt as string);
    this._offset = Date.parse(v.now) - receivedAt;
    this._stop.textContent = hhmmUtc(new Date(this._stopAt));
    this._stop.title = v.stopAt as string;
    this._button.disabled = false;
    const ext = extension(v);
    this._extend.disabled = false;
    this._extend.hidden = ext === null;
    this._minutes = ext ? ext.minutes : 0;
    this._extend.textContent = ext ? ext.label : '';
    this._extend.title = ext ? `The culler keeps it at most until ${hhmmUtc(new Date(Date.parse(v.extendUntil as string)))}` : '';
    this._tick();
    if (!this._timer) {
      this._timer = window.setInterval(() => this._tick(), 1000);
    }
    this.show();
    this._fitHeight();
    window.requestAnimationFrame(() => this._fitHeight());
  }

  hide_(): void {
    this._note.textContent = ''; // a later warning starts without the last answer
    if (this._timer) {
      window.clearInterval(this._timer);
      this._timer = 0;
    }
    this.hide();
  }

  protected onAfterAttach(): void {
    window.addEventListener('resize', this._onResize);
  }

  protected onResize(): void {
    this._fitHeight(); // the shell gave the banner its width: the content may wrap differently
  }

  protected onBeforeDetach(): void {
    window.removeEventListener('resize', this._onResize);
  }

  /** The banner's min-height from its content's, and the shell's layout fitted to it. */
  private _fitHeight(): void {
    if (this.isHidden) {
      return;
    }
    const want = `${Math.ceil(this._content.getBoundingClientRect().height)}px`;
    if (this.node.style.minHeight !== want) {
      this.node.style.minHeight = want;
      this.parent?.fit();
    }
  }

  busy(): void {
    this._button.disabled = true;
    this._extend.disabled = true;
  }

  /** The culler's answer to "Keep for ...": the new stop time (ok), or why not. */
  answered(ok: boolean, message: string, keepUntil?: string): void {
    this._note.textContent = message;
    this._note.classList.toggle('kf-culler-refused', !ok);
    this._button.disabled = false;
    if (ok && keepUntil) {
      this._stopAt = Date.parse(keepUntil);
      this._stop.textContent = hhmmUtc(new Date(this._stopAt));
      this._stop.title = keepUntil;
      this._extend.hidden = true; // until the next verdict says how much room is left
      this._tick();
    } else {
      this._extend.disabled = false;
    }
    this._fitHeight();
  }

  private _tick(): void {
    this._left.textContent = countdown(this._stopAt - (Date.now() + this._offset));
  }
}

class Poller {
  private _settings = ServerConnection.makeSettings();
  private _banner: Banner;
  private _keptAt = 0; // server time of the last "Keep working" (ms), 0: none
  private _dismissed: string | null = null; // the stopAt of the warning the user dismissed
  private _shown: string | null = null; // the stopAt of the warning on show
  private _pass: string | null = null; // the passTime of the verdict on show
  // After "Keep for ...": the time the culler granted, shown while the verdicts are still those of the pass
  // before it (`_pass` then); a later pass reads the culler's keep-until itself.
  private _extended: { until: string; pass: string | null } | null = null;
  private _timer = 0;

  /** `shell`: JupyterLab's (the banner goes to its header area); else the banner is fixed to the top. */
  constructor(shell: ILabShell | null) {
    this._banner = new Banner(() => void this.keep(), () => this.dismiss(), m => void this.extend(m));
    this._banner.hide();
    if (shell) {
      shell.add(this._banner, 'header');
    } else {
      this._banner.addClass('kf-culler-banner-floating');
      Widget.attach(this._banner, document.body);
    }
  }

  private _url(route: string): string {
    return URLExt.join(this._settings.baseUrl, 'kf-culler', route);
  }

  async poll(): Promise<void> {
    let seconds = DEFAULT_POLL_SECONDS;
    try {
      const response = await ServerConnection.makeRequest(this._url('verdict'), { cache: 'no-store' }, this._settings);
      const receivedAt = Date.now();
      if (response.ok) {
        const v = (await response.json()) as IVerdict;
        if (typeof v.pollSeconds === 'number' && v.pollSeconds > 0) {
          seconds = v.pollSeconds;
        }
        this.render(v, receivedAt);
      } else {
        this._banner.hide_();
      }
    } catch (err) {
      this._banner.hide_(); // the culler (or this server) cannot be asked: nothing alarming to show
    }
    this._timer = window.setTimeout(() => void this.poll(), seconds * 1000);
  }

  render(v: IVerdict, receivedAt: number): void {
    if (this._extended && (v.passTime ?? null) === this._extended.pass) {
      v = { ...v, stopAt: this._extended.until, extendUntil: null }; // the pass before the extension
    } else {
      this._extended = null;
    }
    const passTime = v.passTime ? Date.parse(v.passTime) : 0;
    if (!warns(v)) {
      this._dismissed = null; // the warning is over: the next one shows
    }
    if (!warns(v) || (this._keptAt && passTime <= this._keptAt) || v.stopAt === this._dismissed) {
      this._banner.hide_();
      return;
    }
    this._keptAt = 0;
    this._dismissed = null;
    this._shown = v.stopAt as string;
    this._pass = v.passTime ?? null;
    this._banner.show_(v, receivedAt);
  }

  dismiss(): void {
    this._dismissed = this._shown;
    this._banner.hide_();
  }

  async keep(): Promise<void> {
    this._banner.busy();
    try {
      const response = await ServerConnection.makeRequest(this._url('keep'), { method: 'POST', body: '{}' }, this._settings);
      if (response.ok) {
        const doc = (await response.json()) as { at?: string };
        this._keptAt = doc.at ? Date.parse(doc.at) : Date.now();
        this._banner.hide_();
        return;
      }
    } catch (err) {
      console.warn('kf-culler: Keep working failed', err);
    }
    this._banner.show(); // the click did not reach the server: leave the banner up
  }

  async extend(minutes: number): Promise<void> {
    this._banner.busy();
    try {
      const response = await ServerConnection.makeRequest(
        this._url('extend'), { method: 'POST', body: JSON.stringify({ minutes }) }, this._settings);
      const doc = (await response.json()) as { message?: string; keepUntil?: string };
      if (response.ok && doc.keepUntil) {
        this._shown = doc.keepUntil;
        this._extended = { until: doc.keepUntil, pass: this._pass };
        this._banner.answered(true, `Kept until ${hhmmUtc(new Date(Date.parse(doc.keepUntil)))}: ${doc.message || ''}`,
                              doc.keepUntil);
      } else {
        this._banner.answered(false, `More time was not granted: ${doc.message || response.status}`);
      }
    } catch (err) {
      this._banner.answered(false, 'The culler could not be asked; try again in a moment.');
    }
  }

  dispose(): void {
    window.clearTimeout(this._timer);
    this._banner.dispose();
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'kf-culler-jupyterlab:banner',
  description: "kf-culler's warning before an idle stop, with a Keep working button",
  autoStart: true,
  optional: [ILabShell],
  activate: (app: JupyterFrontEnd, shell: ILabShell | null) => {
    void app.restored.then(() => void new Poller(shell).poll());
  }
};

export default plugin;
