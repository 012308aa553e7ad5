// The server extension's reply (`GET {base_url}tfgpu/api/status`, version 1): its types, and
// `parseReply`, which builds a reply of exactly these types from whatever JSON came back.
//
// The contract is the JSON Schema shipped with the server, tfgpu_magic/server/schema/
// status-reply.v1.json: bytes are integers, a missing reading is null (never a made-up 0),
// strings from other processes are already neutralised by the server.  The page still checks
// every field instead of casting: a server of another version, a proxy's error page or a kernel
// whose name is null must show as "unknown", never as "kernel null" or a broken panel.
// `readReply` also says where a reply departs from the schema (tests/test_lab_reply_schema.py
// checks that it finds no departure in exactly the replies the schema allows).
// No runtime imports, so tests run the compiled module in Node on its own.

export const CONTRACT_VERSION = 1;

/** Memory of one GPU split by who holds it (bytes; null where NVML could not say). */
export interface IGpuSplit {
  kernels_bytes: number | null;
  my_other_bytes: number | null;
  others_bytes: number | null;
  unattributed_bytes: number | null;
  free_bytes: number | null;
}

/** One MIG instance of a GPU in MIG mode: its own memory and who runs on it. */
export interface IMigInstance {
  mig_index: number | null; // null: the row only says why the instances could not be listed
  uuid: string | null;
  gpu_instance_id: number | null;
  compute_instance_id: number | null;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  process_count: number | null; // null: NVML could not list them
  kernel_ids: string[] | null; // this server's kernels running on it
  notes: string[];
}

export interface IGpu {
  index: number;
  name: string | null;
  uuid: string | null;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  utilization_percent: number | null;
  lost: boolean;
  notes: string[];
  split: IGpuSplit | null;
  mig_instances: IMigInstance[] | null; // null: not in MIG mode
  share: IGpuShare | null; // the platform's share of this GPU; null: none
}

/** The memory a platform (MPS, MIG, HAMi, Alibaba gpushare, Slurm) granted on one GPU, and who holds it. */
export interface IGpuShare {
  gpu: number;
  uuid: string | null;
  bytes: number;
  source: string;
  hard: boolean;
  label: string; // "hard (MPS)", "soft (HAMi)"
  enforced_by: string;
  evidence: string; // the variable it came from, NAME=value
}

export interface IKernel {
  id: string;
  name: string | null; // the kernel spec's name; null where the server does not know it
  path: string | null;
  session_name: string | null;
  session_type: string | null;
  execution_state: string | null;
  last_activity: string | null; // ISO 8601, the server's clock
  pid: number | null;
  child_pids: number[];
  // nvidia-smi index (as a string) -> bytes, only GPUs it holds memory on; null where NVML lists
  // its processes there but cannot say how much they hold.
  gpu_memory_bytes: Record<string, number | null>;
  total_gpu_memory_bytes: number | null;
  note: string | null; // why it cannot be attributed, when it cannot
  // When the server's GPU idle culler shuts it down if it stays idle (ISO 8601, the server's
  // clock); null when it is not due (culler off, busy, no GPU memory) or the server is older.
  cull_due_at?: string | null;
  // nvidia-smi index (as a string) -> its utilization there, the driver's figures (absent from an
  // older server): `scope` "process" is its own processes' (NVML's samples since the server's
  // previous reading), "device" the whole GPU's where the driver gives none per process (MIG).
  gpu_utilization?: Record<string, IUtilization>;
  // The server's idle tracking: since when it has held memory at 0%, the memory-time held so (bytes
  // times seconds), and the line its notebook shows once past the configured thresholds.
  gpu_idle_since?: string | null;
  idle_gpu_memory_byte_seconds?: number;
  gpu_idle_notice?: string | null;
}

export interface IUtilization {
  percent: number | null; // null: could not be read (note says why)
  scope: 'process' | 'device';
  note: string | null;
}

export interface IProcess {
  gpu: number;
  pid: number;
  used_memory_bytes: number | null;
  command?: string | null; // my other processes, other users'
  user?: string | null; // other users'
  note?: string; // unattributed (exited) and hidden processes: why nobody's
}

/** The server's GPU idle culler, when it is on. */
export interface ICuller {
  idle_after_s: number;
  min_memory_bytes: number;
  free_below_bytes: number | null;
}

export interface IStatusReply {
  version: number;
  generated_at: number | null; // unix seconds, the server's clock; null: its clock gave no finite time
  refresh_interval_s: number | null; // 0: every request reads afresh; null: not a finite number on the server
  driver: { available: boolean; reason: string | null };
  user: string | null;
  gpus: IGpu[];
  kernels: IKernel[];
  my_other_processes: IProcess[];
  other_users: IProcess[];
  unattributed: IProcess[];
  notes: string[];
  // false: NVML lists pids this server cannot see or /proc hides, so some shares are unknown;
  // null: no driver reading.
  pids_visible: boolean | null;
  hidden_processes: IProcess[]; // listed pids /proc hides (hidepid): another user's or exited
  culler?: ICuller | null; // the server's culler settings (absent from an older server)
}

type Json = Record<string, unknown>;

/** A reply as the page reads it, and where the JSON departed from the contract ([] when nowhere). */
export interface IReadReply {
  reply: IStatusReply;
  problems: string[];
}

/**
 * The reply as the types above say, or one line saying why it cannot be read at all.  Fields
 * of the wrong type become null (or are left out of a list); an entry without what identifies
 * it (a GPU without an index, a kernel without an id) is dropped, with a note.
 */
export function parseReply(body: unknown): IStatusReply | string {
  const read = readReply(body);
  return typeof read === 'string' ? read : read.reply;
}

/** `parseReply`'s reply, with each place the JSON breaks the contract (`$.gpus[0].index: not ...`). */
export function readReply(body: unknown): IReadReply | string {
  if (!isObject(body)) {
    return 'The GPU status reply is not a JSON object.';
  }
  if (body.version !== CONTRACT_VERSION) {
    return (
      `The GPU status reply has version ${short(body.version)}, this page understands ${CONTRACT_VERSION}: ` +
      'the server extension and the JupyterLab extension come from different tfgpu_magic versions.'
    );
  }
  if (
    !has(body, 'generated_at') ||
    (body.generated_at !== null && num(body.generated_at) === null) ||
    !Array.isArray(body.gpus) ||
    !Array.isArray(body.kernels) ||
    !isObject(body.driver)
  ) {
    return 'The GPU status reply lacks its time, GPUs, kernels or driver state: it is not from the tfgpu_magic server extension.';
  }
  const problems: string[] = [];
  const top = new Fields(body, '$', problems);
  const notes = top.get('notes', STRINGS, []);
  const reply: IStatusReply = {
    version: top.get('version', VERSION, CONTRACT_VERSION),
    generated_at: top.get('generated_at', nullable(SECONDS), null),
    refresh_interval_s: top.get('refresh_interval_s', nullable(SECONDS), null),
    driver: top.get('driver', DRIVER, { available: false, reason: null }),
    user: top.get('user', nullable(STRING), null),
    gpus: top.entries('gpus', gpu, 'GPU', notes),
    kernels: top.entries('kernels', kernel, 'kernel', notes),
    my_other_processes: top.entries('my_other_processes', processEntry(MY_PROCESS), 'process', notes),
    other_users: top.entries('other_users', processEntry(OTHER_USERS_PROCESS), 'process', notes),
    unattributed: top.entries('unattributed', processEntry(NOTED_PROCESS), 'process', notes),
    notes,
    pids_visible: top.get('pids_visible', nullable(BOOLEAN), null),
    hidden_processes: top.entries('hidden_processes', processEntry(NOTED_PROCESS), 'process', notes)
  };
  if (top.has('culler')) {
    reply.culler = top.get('culler', nullable(CULLER), null);
  }
  top.done();
  return { reply, problems };
}

// -- what each field must be, and what a departure from it is called -----------------------------

/** Reads one value: what it is, or undefined (said by the caller) when it is not `what`. */
interface IRead<T> {
  what: string; // said as "$.gpus[0].index: not <what>"
  read(value: unknown, path: string, problems: string[]): T | undefined;
}

function reader<T>(what: string, read: IRead<T>['read']): IRead<T> {
  return { what, read };
}

function nullable<T>(inner: IRead<T>): IRead<T | null> {
  return reader(`${inner.what} or null`, (v, path, problems) => (v === null ? null : inner.read(v, path, problems)));
}

/** A list; an item that is not `inner` is left out (and said). */
function list<T>(inner: IRead<T>): IRead<T[]> {
  return reader(`a list of ${inner.what}s`, (v, path, problems) => {
    if (!Array.isArray(v)) {
      return undefined;
    }
    const kept: T[] = [];
    v.forEach((item, i) => {
      const got = inner.read(item, `${path}[${i}]`, problems);
      if (got === undefined) {
        problems.push(`${path}[${i}]: not ${inner.what}`);
      } else {
        kept.push(got);
      }
    });
    return kept;
  });
}

/** An object of exactly the keys `build` reads (a missing or an unknown key is said). */
function record<T>(what: string, build: (fields: Fields) => T): IRead<T> {
  return reader(what, (v, path, problems) => {
    if (!isObject(v)) {
      return undefined;
    }
    const fields = new Fields(v, path, problems);
    const built = build(fields);
    fields.done();
    return built;
  });
}

/** A number of the kind `test` accepts (finite, and JSON's integers exactly, below 2^53). */
function number(what: string, test: (n: number) => boolean): IRead<number> {
  return reader(what, v => (typeof v === 'number' && Number.isFinite(v) && test(v) ? v : undefined));
}

const VERSION = reader(`${CONTRACT_VERSION}`, v => (v === CONTRACT_VERSION ? v : undefined));
const NULL = reader('null', v => (v === null ? null : undefined));
const STRING = reader('a string', v => (typeof v === 'string' ? v : undefined));
const STRINGS = list(STRING);
const ID = reader('a non-empty string', v => (typeof v === 'string' && v !== '' ? v : undefined));
const BOOLEAN = reader('true or false', v => (typeof v === 'boolean' ? v : undefined));
const INDEX = number('a whole number ≥ 0', n => Number.isSafeInteger(n) && n >= 0);
const BYTES = number('a whole number of bytes', n => Number.isSafeInteger(n) && n >= 0);
const SECONDS = number('a number of seconds ≥ 0', n => n >= 0);
const POSITIVE = number('a number > 0', n => n > 0);
const PERCENT = number('a percentage (0 to 100)', n => n >= 0 && n <= 100);

const DRIVER = record('the driver state', f => ({
  available: f.get('available', BOOLEAN, false),
  reason: f.get('reason', nullable(STRING), null)
}));

const CULLER = record('the culler settings', f => ({
  idle_after_s: f.get('idle_after_s', POSITIVE, 0),
  min_memory_bytes: f.get('min_memory_bytes', BYTES, 0),
  free_below_bytes: f.get('free_below_bytes', nullable(BYTES), null)
}));

const SPLIT = record(
  'the memory split',
  (f): IGpuSplit => ({
    kernels_bytes: f.get('kernels_bytes', nullable(BYTES), null),
    my_other_bytes: f.get('my_other_bytes', nullable(BYTES), null),
    others_bytes: f.get('others_bytes', nullable(BYTES), null),
    unattributed_bytes: f.get('unattributed_bytes', nullable(BYTES), null),
    free_bytes: f.get('free_bytes', nullable(BYTES), null)
  })
);

/** nvidia-smi index (a string of at most 4 digits) -> bytes or null; another key is left out. */
const MEMORY_BY_GPU = reader('an object of bytes by GPU index', (v, path, problems) => {
  if (!isObject(v)) {
    return undefined;
  }
  const memory: Record<string, number | null> = {};
  const fields = new Fields(v, path, problems);
  for (const index of Object.keys(v)) {
    if (/^\d{1,4}$/.test(index)) {
      memory[index] = fields.get(index, nullable(BYTES), null);
    } else {
      problems.push(`${path}.${index}: not a GPU index`);
    }
  }
  return memory;
});

const SCOPE = reader<'process' | 'device'>('"process" or "device"', v =>
  v === 'process' || v === 'device' ? v : undefined
);
const SECONDS_TIMES_BYTES = number('a number ≥ 0', n => n >= 0);

const UTILIZATION = record(
  'a utilization',
  (f): IUtilization => ({
    percent: f.get('percent', nullable(PERCENT), null),
    scope: f.get('scope', SCOPE, 'process'),
    note: f.get('note', nullable(STRING), null)
  })
);

/** nvidia-smi index -> a utilization; another key is left out (and said). */
const UTILIZATION_BY_GPU = reader('an object of utilizations by GPU index', (v, path, problems) => {
  if (!isObject(v)) {
    return undefined;
  }
  const found: Record<string, IUtilization> = {};
  const fields = new Fields(v, path, problems);
  for (const index of Object.keys(v)) {
    if (/^\d{1,4}$/.test(index)) {
      const read = fields.get<IUtilization | null>(index, UTILIZATION, null);
      if (read !== null) {
        found[index] = read;
      }
    } else {
      problems.push(`${path}.${index}: not a GPU index`);
    }
  }
  return found;
});

const SHARE = record(
  'a platform share',
  (f): IGpuShare => ({
    gpu: f.get('gpu', INDEX, 0),
    uuid: f.get('uuid', nullable(STRING), null),
    bytes: f.get('bytes', BYTES, 0),
    source: f.get('source', STRING, ''),
    hard: f.get('hard', BOOLEAN, false),
    label: f.get('label', STRING, ''),
    enforced_by: f.get('enforced_by', STRING, ''),
    evidence: f.get('evidence', STRING, '')
  })
);

/** One instance, or the one row that says why they could not be listed (mig_index null, and notes). */
const MIG_INSTANCE = record('a MIG instance', (f): IMigInstance => {
  if (f.isNull('mig_index')) {
    return { ...NO_MIG_INSTANCE, mig_index: f.get('mig_index', NULL, null), notes: f.get('notes', STRINGS, []) };
  }
  return {
    mig_index: f.get('mig_index', INDEX, null),
    uuid: f.get('uuid', nullable(STRING), null),
    gpu_instance_id: f.get('gpu_instance_id', nullable(INDEX), null),
    compute_instance_id: f.get('compute_instance_id', nullable(INDEX), null),
    memory_used_bytes: f.get('memory_used_bytes', nullable(BYTES), null),
    memory_total_bytes: f.get('memory_total_bytes', nullable(BYTES), null),
    process_count: f.get('process_count', nullable(INDEX), null),
    kernel_ids: f.get('kernel_ids', nullable(STRINGS), null),
    notes: f.get('notes', STRINGS, [])
  };
});

const NO_MIG_INSTANCE: IMigInstance = {
  mig_index: null,
  uuid: null,
  gpu_instance_id: null,
  compute_instance_id: null,
  memory_used_bytes: null,
  memory_total_bytes: null,
  process_count: null,
  kernel_ids: null,
  notes: []
};



function gpu(f: Fields): IGpu | null {
  const index = f.get('index', INDEX, null);
  if (index === null) {
    return null;
  }
  return {
    index,
    name: f.get('name', nullable(STRING), null),
    uuid: f.get('uuid', nullable(STRING), null),
    memory_used_bytes: f.get('memory_used_bytes', nullable(BYTES), null),
    memory_total_bytes: f.get('memory_total_bytes', nullable(BYTES), null),
    utilization_percent: f.get('utilization_percent', nullable(PERCENT), null),
    lost: f.get('lost', BOOLEAN, false),
    notes: f.get('notes', STRINGS, []),
    split: f.get('split', nullable(SPLIT), null),
    mig_instances: f.get('mig_instances', nullable(list(MIG_INSTANCE)), null),
    share: f.get('share', nullable(SHARE), null)
  };
}


function kernel(f: Fields): IKernel | null {
  const id = f.get('id', ID, null);
  if (id === null) {
    return null;
  }
  const read: IKernel = {
    id,
    name: f.get('name', nullable(STRING), null),
    path: f.get('path', nullable(STRING), null),
    session_name: f.get('session_name', nullable(STRING), null),
    session_type: f.get('session_type', nullable(STRING), null),
    execution_state: f.get('execution_state', nullable(STRING), null),
    last_activity: f.get('last_activity', nullable(STRING), null),
    pid: f.get('pid', nullable(INDEX), null),
    child_pids: f.get('child_pids', list(INDEX), []),
    gpu_memory_bytes: f.get('gpu_memory_bytes', MEMORY_BY_GPU, {}),
    total_gpu_memory_bytes: f.get('total_gpu_memory_bytes', nullable(BYTES), null),
    note: f.get('note', nullable(STRING), null)
  };
  if (f.has('cull_due_at')) {
    read.cull_due_at = f.get('cull_due_at', nullable(STRING), null);
  }
  if (f.has('gpu_utilization')) {
    read.gpu_utilization = f.get('gpu_utilization', UTILIZATION_BY_GPU, {});
  }
  if (f.has('gpu_idle_since')) {
    read.gpu_idle_since = f.get('gpu_idle_since', nullable(STRING), null);
  }
  if (f.has('idle_gpu_memory_byte_seconds')) {
    read.idle_gpu_memory_byte_seconds = f.get('idle_gpu_memory_byte_seconds', SECONDS_TIMES_BYTES, 0);
  }
  if (f.has('gpu_idle_notice')) {
    read.gpu_idle_notice = f.get('gpu_idle_notice', nullable(STRING), null);
  }
  return read;
}

// Each list's own keys beside gpu, pid and used_memory_bytes: the server writes no others.
const MY_PROCESS = { command: nullable(STRING) };
const OTHER_USERS_PROCESS = { user: nullable(STRING), command: nullable(STRING) };
const NOTED_PROCESS = { note: STRING };

/** The reader of one list's process entries. */
function processEntry(
  own: Partial<Record<'command' | 'user' | 'note', IRead<string | null>>>
): (f: Fields) => IProcess | null {
  return (f: Fields): IProcess | null => {
    const gpuIndex = f.get('gpu', INDEX, null);
    const pid = f.get('pid', INDEX, null);
    if (gpuIndex === null || pid === null) {
      return null;
    }
    const entry: IProcess = { gpu: gpuIndex, pid, used_memory_bytes: f.get('used_memory_bytes', nullable(BYTES), null) };
    if (own.command) {
      entry.command = f.get('command', own.command, null);
    }
    if (own.user) {
      entry.user = f.get('user', own.user, null);
    }
    if (own.note) {
      entry.note = f.get('note', own.note, null) ?? undefined;
    }
    return entry;
  };
}

/**
 * One JSON object of the reply being read: its fields, each checked against what it must be.
 * The keys it must have are those read with `get`; `done` says those it has and nobody read.
 */
class Fields {
  constructor(
    private readonly _value: Json,
    private readonly _path: string,
    private readonly _problems: string[]
  ) {}

  has(key: string): boolean {
    return has(this._value, key);
  }

  isNull(key: string): boolean {
    return this.has(key) && this._value[key] === null;
  }

  /** The field as `read` reads it; `fallback` when it is missing (said) or is not what `read` reads (said). */
  get<T>(key: string, read: IRead<T>, fallback: T): T {
    this._read.add(key);
    const path = `${this._path}.${key}`;
    if (!this.has(key)) {
      this._problems.push(`${path}: missing`);
      return fallback;
    }
    const got = read.read(this._value[key], path, this._problems);
    if (got === undefined) {
      this._problems.push(`${path}: not ${read.what}`);
      return fallback;
    }
    return got;
  }

  /** Says each key of the object that no `get` read: it is not a key of this version. */
  done(): void {
    for (const key of Object.keys(this._value).filter(k => !this._read.has(k))) {
      this._problems.push(`${this._path}.${key}: not a key of this version of the reply`);
    }
  }

  /** The entries of a list `parse` accepts; one note per kind for those it could not read. */
  entries<T>(key: string, parse: (f: Fields) => T | null, kind: string, notes: string[]): T[] {
    const entry = reader(`a ${kind} entry`, (v, path, problems) => {
      if (!isObject(v)) {
        return undefined;
      }
      const fields = new Fields(v, path, problems);
      const parsed = parse(fields);
      if (parsed === null) {
        return undefined; // without what identifies it: left out, and said
      }
      fields.done();
      return parsed;
    });
    const value = this._value[key];
    const kept = this.get(key, list(entry), []);
    const dropped = (Array.isArray(value) ? value.length : 0) - kept.length;
    if (dropped) {
      notes.push(
        `${dropped} ${kind} entr${dropped === 1 ? 'y' : 'ies'} of the reply could not be read and ${dropped === 1 ? 'is' : 'are'} not shown.`
      );
    }
    return kept;
  }

  private readonly _read = new Set<string>();
}

function has(v: Json, key: string): boolean {
  return Object.prototype.hasOwnProperty.call(v, key);
}

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

function short(v: unknown): string {
  const text = typeof v === 'string' ? JSON.stringify(v) : String(v);
  return text.length > 40 ? `${text.slice(0, 40)}…` : text;
}
