/**
 * The words of UI.md: how states, sizes, durations and requests read.
 */
import { ICache, IJob, JobState } from './api';

const GIB = 1024 ** 3;
const MIB = 1024 ** 2;

export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !isFinite(bytes)) {
    return '–';
  }
  if (bytes >= GIB) {
    const gib = bytes / GIB;
    return `${gib >= 10 ? Math.round(gib) : gib.toFixed(1)} GiB`;
  }
  return `${Math.round(bytes / MIB)} MiB`;
}

/** "12m 04s", "41m", "2h 03m", "8s". */
export function formatDuration(seconds: number | null | undefined, precise = true): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds) || seconds < 0) {
    return '–';
  }
  const s = Math.floor(seconds);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const rest = s % 60;
  const pad = (n: number) => n.toString().padStart(2, '0');
  if (h > 0) {
    return `${h}h ${pad(m)}m`;
  }
  if (m > 0) {
    return precise ? `${m}m ${pad(rest)}s` : `${m}m`;
  }
  return `${rest}s`;
}

export function formatTime(epoch: number | null | undefined): string {
  if (!epoch) {
    return '–';
  }
  return new Date(epoch * 1000).toLocaleTimeString();
}

/** The colour family of a state chip (a CSS modifier class). */
export function stateTone(state: JobState): string {
  switch (state) {
    case 'queued':
      return 'queued';
    case 'running':
      return 'running';
    case 'succeeded':
      return 'done';
    case 'failed':
    case 'lost':
    case 'timeout':
      return 'failed';
    case 'cancelled':
      return 'cancelled';
    case 'preempted':
      return 'preempted';
    default:
      return 'queued';
  }
}

/** The short word on the chip itself. */
export function stateChip(state: JobState): string {
  switch (state) {
    case 'succeeded':
      return 'done';
    case 'lost':
    case 'timeout':
      return 'failed';
    default:
      return state;
  }
}

/** The full phrase of UI.md, e.g. "queued · #3 in line · waiting for 2 GPUs". */
export function stateWords(job: IJob, now: number): string {
  switch (job.state) {
    case 'queued': {
      const parts = ['queued'];
      if (job.position) {
        parts.push(`#${job.position} in line`);
      }
      const starts = startWords(job, now);
      if (starts) {
        parts.push(starts);
      }
      if (job.waiting) {
        parts.push(job.waiting);
      }
      return parts.join(' · ');
    }
    case 'running':
      return `running · ${formatDuration(job.started ? now - job.started : null)}`;
    case 'succeeded':
      return `done · ${formatDuration(ranFor(job, now), false)}`;
    case 'failed':
    case 'lost':
    case 'timeout':
      return `failed: ${job.reason || job.state}`;
    case 'cancelled':
      return 'cancelled';
    case 'preempted':
      return 'preempted · requeued';
    default:
      return String(job.state);
  }
}

/**
 * When a waiting job should start, as a person says it: "starts in ~40 min (by ~1 h)", or
 * "start uncertain: the queue ahead may take ~2 days" when its P80 is too far out (or it
 * has only a P80: the work ahead of a job too deep in line to forecast);
 * "" without an estimate (no number rather than a made-up one). Same words as words.py.
 */
export function startWords(job: IJob, now: number): string {
  const p80 = job.start_p80;
  if (job.expected_start === null || job.expected_start === undefined) {
    // no expected start but a P80: too deep in line to forecast, the work ahead of it
    if (p80 === null || p80 === undefined) {
      return '';
    }
    return `start uncertain: the queue ahead may take ${about(p80 - now)}`;
  }
  const ahead = job.expected_start - now;
  if (p80 !== null && p80 !== undefined && uncertain(job.expected_start, p80, now)) {
    return `start uncertain: the queue ahead may take ${about(p80 - now)}`;
  }
  let words = `starts in ${about(ahead)}`;
  if (job.start_p80 !== null && job.start_p80 !== undefined) {
    const bound = job.start_p80 - now;
    if (bound >= 60 && about(bound) !== about(ahead)) {
      words += ` (by ${about(bound)})`;
    }
  }
  return words;
}

/** A P80 wait at least this long (seconds)... */
export const UNCERTAIN_FROM = 60;
/** ...and more than this many times the expected wait: too spread to give as a number. */
export const UNCERTAIN_SPREAD = 3;

/** Whether an estimate is too spread to give as a number (words.py's ``uncertain``). */
export function uncertain(expected: number, p80: number, now: number): boolean {
  const bound = p80 - now;
  return bound >= UNCERTAIN_FROM && bound > UNCERTAIN_SPREAD * Math.max(0, expected - now);
}

/** A span rounded as a person says it: "<1 min", "~7 min", "~40 min", "~1.5 h", "~2 days". */
export function about(seconds: number): string {
  const minutes = seconds / 60;
  if (minutes < 1) {
    return '<1 min';
  }
  if (minutes < 10) {
    return `~${pyRound(minutes)} min`;
  }
  if (minutes < 55) {
    return `~${5 * pyRound(minutes / 5)} min`;
  }
  const hours = minutes / 60;
  if (hours < 2.75) {
    return `~${pyRound(hours * 2) / 2} h`;
  }
  if (hours < 36) {
    return `~${pyRound(hours)} h`;
  }
  return `~${pyRound(hours / 24)} days`;
}

/** Python's round(): halves go to the even neighbour, so both sides say the same words. */
function pyRound(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

export function waitedFor(job: IJob, now: number): number | null {
  const end = job.started ?? job.finished ?? now;
  return end - job.submitted;
}

export function ranFor(job: IJob, now: number): number | null {
  if (!job.started) {
    return null;
  }
  return (job.finished ?? now) - job.started;
}

/** "2 GPU · 8 CPU · 32 GiB" */
export function requestText(job: IJob): string {
  if (job.request.text) {
    return job.request.text;
  }
  const parts: string[] = [];
  if (job.request.gpus) {
    parts.push(`${job.request.gpus} GPU`);
  }
  parts.push(`${job.request.cpus} CPU`);
  if (job.request.mem) {
    parts.push(formatBytes(job.request.mem));
  }
  return parts.join(' · ');
}

/** The progress fraction in [0, 1], or null when unknown. */
export function progressFraction(job: IJob): number | null {
  const p = job.progress;
  if (!p || !p.total) {
    return null;
  }
  return Math.max(0, Math.min(1, p.done / p.total));
}

/** The last metric reported with `dls.progress`, e.g. "loss 0.31". */
export function lastMetric(job: IJob): string {
  const metrics = job.progress?.metrics;
  if (!metrics) {
    return '';
  }
  if (job.kind === 'kernel' && typeof metrics.idle_min === 'number') {
    return kernelIdleWords(metrics.idle_min);
  }
  const names = Object.keys(metrics);
  if (!names.length) {
    return '';
  }
  const name = names[names.length - 1];
  const value = metrics[name];
  const text = typeof value === 'number' ? formatNumber(value) : String(value);
  return `${name} ${text}`;
}

/** Four significant digits, no trailing zeros ("0.31", "1235"), as the Python widgets write. */
function formatNumber(value: number): string {
  if (Number.isInteger(value)) {
    return String(value);
  }
  return String(Number(value.toPrecision(4)));
}

export const PRIORITY_NAMES: { [value: number]: string } = {
  0: 'low',
  50: 'normal',
  100: 'high',
  1000: 'urgent'
};

/**
 * How a priority reads everywhere: the word for a named level, else the number with its label,
 * e.g. "high", "normal", "priority 75" (as `priority_words` in words.py).
 */
export function priorityText(priority: number): string {
  return PRIORITY_NAMES[priority] ?? `priority ${priority}`;
}

/** "anna · sweep.ipynb": the owner and the last part of where the job came from. */
export function ownerText(job: IJob): string {
  const origin = originName(job.origin);
  return origin ? `${job.owner} · ${origin}` : job.owner;
}

/** Origins that say what submitted a job but name no notebook or program (as words.py). */
const NO_PLACE = ['', 'notebook', 'python', '-'];

/** The file name of a notebook path ("/home/anna/exp/sweep.ipynb" -> "sweep.ipynb"). */
export function originName(origin: string | null): string {
  if (origin === null || NO_PLACE.includes(origin)) {
    return '';
  }
  const trimmed = origin.replace(/\/+$/, '');
  return trimmed.slice(trimmed.lastIndexOf('/') + 1);
}

/** The next priority step up or down (low < normal < high < urgent, numbers in between). */
export function nextPriority(priority: number, direction: 1 | -1): number {
  const steps = [0, 50, 100, 1000];
  if (direction > 0) {
    return steps.find(step => step > priority) ?? priority + 100;
  }
  const lower = steps.filter(step => step < priority);
  return lower.length ? lower[lower.length - 1] : priority - 10;
}

export function isFinished(state: JobState): boolean {
  return !['queued', 'running', 'preempted'].includes(state);
}

/** The part of the phrase after the chip word: "#3 in line · waiting for 2 GPUs", a failure reason. */
export function stateDetail(job: IJob, now: number): string {
  const words = stateWords(job, now);
  if (words.startsWith('failed: ')) {
    return words.slice('failed: '.length);
  }
  const cut = words.indexOf(' · ');
  return cut < 0 ? '' : words.slice(cut + 3);
}

/** The icon that starts a cell's status line (as the notebook widgets draw it). */
export const STATE_ICONS: { [state: string]: string } = {
  queued: '⏳',
  running: '▶',
  succeeded: '✔',
  failed: '✖',
  lost: '✖',
  timeout: '✖',
  cancelled: '⊘',
  preempted: '↻'
};

/** "GPU 1", "GPUs 0,1" or "CPU": where a job runs. */
export function devicesWords(job: IJob): string {
  if (!job.devices.length) {
    return 'CPU';
  }
  return job.devices.length === 1 ? `GPU ${job.devices[0]}` : `GPUs ${job.devices.join(',')}`;
}

/**
 * A scheduled cell's status line, as the notebook widget writes it: "▶ running on GPU 1 · 3m 12s",
 * "✔ done in 4m 40s", "⏳ queued · #2 in line · waiting for 1 GPU", "✖ failed: …".
 */
export function lineWords(job: IJob, now: number): string {
  const icon = STATE_ICONS[job.state] ?? '•';
  if (job.state === 'running') {
    return `${icon} running on ${devicesWords(job)} · ${formatDuration(ranFor(job, now))}`;
  }
  if (job.state === 'succeeded') {
    return `${icon} done in ${formatDuration(ranFor(job, now))}`;
  }
  return `${icon} ${stateWords(job, now)}`;
}

/**
 * How far a job without a total got: "step 12"; a GPU kernel's lease counts the cells it
 * ran: "3 cells" (docs/kernels.md); "" without progress.
 */
export function stepWords(job: IJob): string {
  if (!job.progress) {
    return '';
  }
  const done = job.progress.done;
  if (job.kind === 'kernel') {
    return `${done} cell${done === 1 ? '' : 's'}`;
  }
  return `step ${done}`;
}

/** "70% loss 0.31", "step 12 loss 0.31" or "" (as the notebook widget writes it). */
export function progressWords(job: IJob): string {
  if (!job.progress) {
    return '';
  }
  if (job.kind === 'kernel') {
    const idleHours = Number(job.progress.metrics?.idle_gpu_h ?? 0);
    const held = idleHours >= 0.01 ? ` · ${idleHours.toFixed(2)} GPU-h idle` : '';
    const idle = lastMetric(job);
    return `${stepWords(job)}${idle ? ` · ${idle}` : ''}${held}`;
  }
  const fraction = progressFraction(job);
  const head = fraction === null ? stepWords(job) : `${Math.round(fraction * 100)}%`;
  return `${head} ${lastMetric(job)}`.trim();
}

/** A GPU kernel's idle stretch, "idle 12 min" ("idle <1 min"), as docs/kernels.md says. */
function kernelIdleWords(minutes: number): string {
  return minutes < 1 ? 'idle <1 min' : `idle ${Math.round(minutes)} min`;
}

/** CPU time with a decimal under a minute ("0.4s"), else as a duration ("39m", "2h 03m"). */
function cpuWords(seconds: number, precise: boolean): string {
  return seconds < 60 ? `${seconds.toFixed(1)}s` : formatDuration(seconds, precise);
}

/**
 * What a finished job used, compact: "0.68 GPU-h · CPU 39m · peak RAM 3.1 GiB", and the same in
 * full words for its tooltip. Figures that were not measured are left out; both are '' when
 * nothing was.
 */
export function usageWords(job: IJob): { short: string; long: string } {
  const usage = job.usage;
  const short: string[] = [];
  const long: string[] = [];
  if (!usage) {
    return { short: '', long: '' };
  }
  if (job.request.gpus && usage.gpu_hours !== null) {
    short.push(`${usage.gpu_hours.toFixed(2)} GPU-h`);
    long.push(`${usage.gpu_hours.toFixed(2)} GPU-hours (GPUs granted × time running)`);
  }
  if (usage.cpu_time !== null) {
    short.push(`CPU ${cpuWords(usage.cpu_time, false)}`);
    long.push(`CPU time ${cpuWords(usage.cpu_time, true)}`);
  }
  if (usage.peak_rss) {
    short.push(`peak RAM ${formatBytes(usage.peak_rss)}`);
    long.push(`peak RAM ${formatBytes(usage.peak_rss)}`);
  }
  if (usage.peak_gpu_mem) {
    short.push(`peak GPU ${formatBytes(usage.peak_gpu_mem)}`);
    long.push(`peak GPU memory ${formatBytes(usage.peak_gpu_mem)}`);
  }
  return { short: short.join(' · '), long: long.length ? `used: ${long.join(' · ')}` : '' };
}

/** Whether the stage-in cache has been used at all (otherwise the sidebar leaves it out). */
export function cacheUsed(cache: ICache | null): cache is ICache {
  return (
    cache !== null &&
    (cache.entries > 0 || cache.hits + cache.misses > 0 || cache.staging.length > 0)
  );
}

/** "3 entries · 12 hits · staging 1": the cache's counts after its size. */
export function cacheCounts(cache: ICache): string {
  const parts = [
    `${cache.entries} ${cache.entries === 1 ? 'entry' : 'entries'}`,
    `${cache.hits} ${cache.hits === 1 ? 'hit' : 'hits'}`
  ];
  if (cache.staging.length) {
    parts.push(`staging ${cache.staging.length}`);
  }
  return parts.join(' · ');
}

/**
 * What a running job uses now: "cpu 180% · 1.2 GiB" (as `live_usage_words` in the widgets);
 * '' for a job not running or a server that does not measure it.
 */
export function liveUsageWords(job: IJob): string {
  if (job.state !== 'running') {
    return '';
  }
  const parts: string[] = [];
  const cpu = job.cpu_now;
  if (typeof cpu === 'number' && isFinite(cpu)) {
    parts.push(`cpu ${Math.round(cpu)}%`);
  }
  const rss = job.rss_now;
  if (typeof rss === 'number' && isFinite(rss) && rss >= 0) {
    parts.push(formatBytes(rss));
  }
  return parts.join(' · ');
}
