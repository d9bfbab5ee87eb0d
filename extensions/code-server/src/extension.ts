/**
 * kf-culler in code-server: while the culler warns that this notebook will be stopped for being idle,
 * a warning notification gives the culler's reason and the stop time with a "Keep working" button, and
 * a status bar item counts down to the stop (clicking it shows the notification again).
 *
 * The extension runs in code-server's extension host, on the notebook's side: it asks the culler itself
 * (culler.ts) every `pollSeconds`, and shows nothing while the culler is far from a stop or cannot be
 * asked. "Keep working" sends one request to code-server, which its heartbeat counts; the warning then
 * stays hidden until a verdict from a later culler pass still warns. Closing the notification hides it
 * for this warning (this stop time); the status bar item stays until the warning is over.
 */
import * as vscode from 'vscode';
import { askCuller, askExtend, countdown, extension, hhmmUtc, keep, Verdict, warns } from './culler';

const KEEP = 'Keep working';

class Warning implements vscode.Disposable {
  private item: vscode.StatusBarItem;
  private poller: NodeJS.Timeout | undefined;
  private ticker: NodeJS.Timeout | undefined;
  private current: Verdict | null = null; // the warning on show
  private notified: string | null = null; // the stopAt whose notification was shown
  private keptAt = 0; // when "Keep working" was answered (ms), 0: none
  private disposed = false;

  constructor(private readonly log: vscode.OutputChannel) {
    this.item = vscode.window.createStatusBarItem('kfCuller.warning', vscode.StatusBarAlignment.Left, 1000);
    this.item.name = 'kf-culler idle warning';
    this.item.command = 'kfCuller.showWarning';
    this.item.backgroundColor = new vscode.ThemeColor('statusBarItem.warningBackground');
  }

  async poll(): Promise<void> {
    let v: Verdict;
    try {
      v = await askCuller();
    } catch (err) {
      v = { available: false, why: String(err), now: new Date().toISOString(), pollSeconds: 30 };
    }
    if (this.disposed) {
      return;
    }
    if (!v.available) {
      this.log.appendLine(`verdict unavailable: ${v.why}`);
    }
    this.render(v);
    this.poller = setTimeout(() => void this.poll(), v.pollSeconds * 1000);
  }

  render(v: Verdict): void {
    const passTime = v.passTime ? Date.parse(v.passTime) : 0;
    if (!warns(v) || (this.keptAt && passTime <= this.keptAt)) {
      if (!warns(v)) {
        this.notified = null; // the warning is over: the next one is notified
      }
      this.hide();
      return;
    }
    this.keptAt = 0;
    this.current = v;
    this.tick();
    this.item.show();
    if (!this.ticker) {
      this.ticker = setInterval(() => this.tick(), 1000);
    }
    if (this.notified !== v.stopAt) {
      this.notified = v.stopAt as string;
      void this.notify();
    }
  }

  private tick(): void {
    const v = this.current;
    if (!v || !v.stopAt) {
      return;
    }
    const stopAt = Date.parse(v.stopAt);
    this.item.text = `$(watch) Idle stop in ${countdown(stopAt - Date.now())}`;
    const tip = new vscode.MarkdownString();
    tip.appendText(`This notebook server will be stopped soon. ${v.reason || ''}\n\n`);
    tip.appendText(`Stops at ${hhmmUtc(new Date(stopAt))}. Click for ${KEEP}.`);
    this.item.tooltip = tip;
  }

  /** The notification: the reason, the stop time, Keep working. Closing it leaves the status bar item. */
  async notify(): Promise<void> {
    const v = this.current;
    if (!v || !v.stopAt) {
      return;
    }
    const message = `This notebook server will be stopped soon. ${v.reason || ''} ` +
      `Stops at ${hhmmUtc(new Date(Date.parse(v.stopAt)))}.`;
    const more = extension(v);
    const choice = await vscode.window.showWarningMessage(message, ...(more ? [KEEP, more.label] : [KEEP]));
    if (choice === KEEP) {
      await this.keepWorking();
    } else if (more && choice === more.label) {
      await this.extend(more.minutes);
    }
  }

  /** "Keep for N more hours": the culler writes keep-until itself; the answer is shown. */
  async extend(minutes: number): Promise<void> {
    const answer = await askExtend(minutes);
    this.log.appendLine(`Keep for ${minutes} more minutes: ${answer.ok ? answer.keepUntil : 'refused'}: ${answer.message}`);
    if (answer.ok && answer.keepUntil) {
      this.keptAt = Date.now(); // hidden until a later pass still warns
      this.hide();
      void vscode.window.showInformationMessage(
        `Kept until ${hhmmUtc(new Date(Date.parse(answer.keepUntil)))}: ${answer.message}`);
    } else {
      void vscode.window.showWarningMessage(`More time was not granted: ${answer.message}`);
    }
  }

  async keepWorking(): Promise<void> {
    try {
      const status = await keep();
      this.log.appendLine(`Keep working: code-server answered ${status}`);
      this.keptAt = Date.now();
      this.hide();
    } catch (err) {
      this.log.appendLine(`Keep working failed: ${err}`);
      void vscode.window.showErrorMessage(`kf-culler: Keep working did not reach code-server (${err}).`);
    }
  }

  hide(): void {
    this.current = null;
    this.item.hide();
    if (this.ticker) {
      clearInterval(this.ticker);
      this.ticker = undefined;
    }
  }

  dispose(): void {
    this.disposed = true;
    if (this.poller) {
      clearTimeout(this.poller);
    }
    this.hide();
    this.item.dispose();
  }
}

export function activate(context: vscode.ExtensionContext): void {
  const log = vscode.window.createOutputChannel('kf-culler');
  const warning = new Warning(log);
  context.subscriptions.push(
    log,
    warning,
    vscode.commands.registerCommand('kfCuller.keepWorking', () => warning.keepWorking()),
    vscode.commands.registerCommand('kfCuller.showWarning', () => warning.notify())
  );
  void warning.poll();
}

export function deactivate(): void {
  // everything is in context.subscriptions
}
