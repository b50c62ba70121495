/**
 * Typed access to the server extension's REST API (`/dlsched/api/v1/`).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export const API_ROOT = 'dlsched/api/v1';

export type JobState =
  | 'queued'
  | 'running'
  | 'succeeded'
  | 'failed'
  | 'cancelled'
  | 'timeout'
  | 'lost'
  | 'preempted';

export const ACTIVE_STATES: ReadonlyArray<JobState> = ['queued', 'running', 'preempted'];

export interface IProgress {
  done: number;
  total: number | null;
  metrics: { [name: string]: number | string };
  at: number;
}

/** What a job used over all its attempts; null where it was not measured. */
export interface IUsage {
  /** GPUs granted x time running, in hours. */
  gpu_hours: number | null;
  /** CPU seconds (user + system). */
  cpu_time: number | null;
  /** Largest resident memory, in bytes. */
  peak_rss: number | null;
  /** Largest GPU memory held (all its GPUs), in bytes. */
  peak_gpu_mem: number | null;
}

export interface IJob {
  id: string;
  name: string;
  owner: string;
  origin: string | null;
  kind: string;
  state: JobState;
  reason: string | null;
  priority: number;
  request: {
    gpus: number;
    gpu_mem: number | null;
    cpus: number;
    mem: number | null;
    text: string;
  };
  devices: number[];
  /** Memory granted on each device, in the order of `devices`. */
  gpu_mem_granted?: number[];
  submitted: number;
  started: number | null;
  finished: number | null;
  time_limit: number | null;
  attempts: number;
  retries: number;
  preemptible: boolean;
  after: string[];
  progress: IProgress | null;
  exit_code: number | null;
  position: number | null;
  waiting: string | null;
  /** When a waiting job should start (epoch seconds) and the bound 80 % start by; null or absent when not estimated. */
  expected_start?: number | null;
  start_p80?: number | null;
  /** A cell run in a thread of its kernel (`--inline`) rather than a job process. */
  inline?: boolean;
  /** Absent from servers older than the usage columns. */
  usage?: IUsage;
  /** A running job's CPU now, in percent of one core; null or absent when not measured. */
  cpu_now?: number | null;
  /** A running job's resident memory now, in bytes; null or absent when not measured. */
  rss_now?: number | null;
  /** A notebook job of the user's: where its executed copy is (null until it starts). */
  notebook?: INotebookRecord | null;
  /** The schedule (`--every`) this job is the last run of, with its next run. */
  schedule?: { id: string; every: string; next_run: number } | null;
}

export interface INotebookRecord {
  input: string;
  output: string;
  /** The output's path in the server's folder (what JupyterLab opens), null outside it. */
  path: string | null;
}

export interface IGpuProcess {
  pid: number;
  used_mem: number;
  job_id: string | null;
  /** whose it is, when no job of the pool owns it (null where it cannot be seen) */
  user?: string | null;
  command?: string | null;
}

export interface IGpu {
  index: number;
  uuid: string;
  name: string;
  mem_total: number;
  mem_used: number;
  util: number | null;
  simulated: boolean;
  processes: IGpuProcess[];
  jobs: string[];
}

export interface IPool {
  cpus: { count: number; percent: number };
  memory: { total: number; used: number; available: number };
  gpus: IGpu[];
  gpu_error: string | null;
}

export interface IStatus {
  user: string;
  /** May cancel and reprioritise every job (always, in one's own pool). */
  admin?: boolean;
  /** The pool is shared by every user of the machine (team mode). */
  shared?: boolean;
  version: string;
  policy: string;
  counts: { [state: string]: number };
  gpus: { total: number; busy: number };
  /** The server's clock when it answered (epoch seconds). */
  time?: number;
  [key: string]: unknown;
}

/** The stage-in cache (`GET cache`, `Scheduler.cache_info()`). */
export interface ICache {
  folder: string;
  /** The cap; null when the folder's size cannot be read. */
  max_bytes: number | null;
  bytes: number;
  entries: number;
  in_use: number;
  hits: number;
  misses: number;
  evictions: number;
  /** In a shared pool: the bytes this user's entries hold, and this user's share. */
  user_bytes?: number;
  user_max_bytes?: number | null;
  staging: {
    source: string;
    done_bytes: number;
    total_bytes: number | null;
    rate: number | null;
    note: string | null;
  }[];
}

export interface IJobPage {
  jobs: IJob[];
  limit: number;
  offset: number;
  next_offset: number | null;
}

export interface ILogChunk {
  id: string;
  text: string;
  offset: number;
  next_offset: number;
  size: number;
}

export interface ISample {
  time: number;
  /** `gpu:<index>`, `cpu` or `ram`. */
  source: string;
  util: number | null;
  mem_used: number | null;
  mem_total: number | null;
  data: { jobs?: { [id: string]: number }; allocated?: string[] } | null;
}

export interface IMetrics {
  since: number;
  until: number;
  samples: ISample[];
}

/** Raised when the server answers but has no dlsched routes: the server extension is not enabled. */
export class ServerPartMissing extends Error {
  constructor() {
    super(
      'The jupyter-dlsched server extension is not running in this Jupyter server. ' +
        'Install the package into the environment that runs JupyterLab ' +
        '(pip install jupyter-dlsched) and restart the server; ' +
        '`jupyter server extension list` should show jupyter_dlsched enabled.'
    );
    this.name = 'ServerPartMissing';
  }
}

/** An error answer from the API, carrying its JSON message. */
export class APIError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
    this.name = 'APIError';
  }
}

/**
 * Call the REST API and return the decoded JSON answer.
 *
 * `requestAPI<IStatus>('status')` or `requestAPI('jobs/ab12/cancel', { method: 'POST' })`.
 */
export async function requestAPI<T>(endPoint: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, API_ROOT, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let data: any = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    if (response.status === 404 && (data === null || typeof data !== 'object')) {
      throw new ServerPartMissing();
    }
    const message =
      data && typeof data.message === 'string' ? data.message : response.statusText;
    throw new APIError(response.status, message);
  }
  return data as T;
}

/** Build a query string from defined values only. */
export function query(params: { [key: string]: string | number | undefined | null }): string {
  const parts: string[] = [];
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') {
      parts.push(`${encodeURIComponent(key)}=${encodeURIComponent(String(value))}`);
    }
  }
  return parts.length ? `?${parts.join('&')}` : '';
}

export function jobPath(id: string, rest = ''): string {
  return `jobs/${encodeURIComponent(id)}${rest}`;
}
