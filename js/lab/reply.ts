// The server extension's reply (`GET {base_url}tfgpu/api/status`, version 1): its types, and
// `parseReply`, which builds a reply of exactly these types from whatever JSON came back.
//
// The contract: bytes are integers, a missing reading is null (never a made-up 0), strings
// from other processes are already neutralised by the server.  The page still checks every
// field instead of casting: a server of another version, a proxy's error page or a kernel
// whose name is null must show as "unknown", never as "kernel null" or a broken panel.
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
}

export interface IProcess {
  gpu: number;
  pid: number;
  used_memory_bytes: number | null;
  command?: string | null;
  user?: string | null;
  note?: string | null;
}

export interface IStatusReply {
  version: number;
  generated_at: number; // unix seconds, the server's clock
  refresh_interval_s: number;
  driver: { available: boolean; reason: string | null };
  user: string | null;
  gpus: IGpu[];
  kernels: IKernel[];
  my_other_processes: IProcess[];
  other_users: IProcess[];
  unattributed: IProcess[];
  notes: string[];
}

type Json = Record<string, unknown>;

/**
 * The reply as the types above say, or one line saying why it cannot be read at all.  Fields
 * of the wrong type become null (or are left out of a list); an entry without what identifies
 * it (a GPU without an index, a kernel without an id) is dropped, with a note.
 */
export function parseReply(body: unknown): IStatusReply | string {
  if (!isObject(body)) {
    return 'The GPU status reply is not a JSON object.';
  }
  if (body.version !== CONTRACT_VERSION) {
    return (
      `The GPU status reply has version ${short(body.version)}, this page understands ${CONTRACT_VERSION}: ` +
      'the server extension and the JupyterLab extension come from different tfgpu_magic versions.'
    );
  }
  const generatedAt = num(body.generated_at);
  if (generatedAt === null || !Array.isArray(body.gpus) || !Array.isArray(body.kernels) || !isObject(body.driver)) {
    return 'The GPU status reply lacks its time, GPUs, kernels or driver state: it is not from the tfgpu_magic server extension.';
  }
  const notes = strings(body.notes);
  const gpus = entries(body.gpus, gpu, 'GPU', notes);
  const kernels = entries(body.kernels, kernel, 'kernel', notes);
  return {
    version: CONTRACT_VERSION,
    generated_at: generatedAt,
    refresh_interval_s: num(body.refresh_interval_s) ?? 2,
    driver: { available: body.driver.available === true, reason: str(body.driver.reason) },
    user: str(body.user),
    gpus,
    kernels,
    my_other_processes: entries(body.my_other_processes, processEntry, 'process', notes),
    other_users: entries(body.other_users, processEntry, 'process', notes),
    unattributed: entries(body.unattributed, processEntry, 'process', notes),
    notes
  };
}

function gpu(v: Json): IGpu | null {
  const index = int(v.index);
  if (index === null) {
    return null;
  }
  return {
    index,
    name: str(v.name),
    uuid: str(v.uuid),
    memory_used_bytes: num(v.memory_used_bytes),
    memory_total_bytes: num(v.memory_total_bytes),
    utilization_percent: num(v.utilization_percent),
    lost: v.lost === true,
    notes: strings(v.notes),
    split: isObject(v.split)
      ? {
          kernels_bytes: num(v.split.kernels_bytes),
          my_other_bytes: num(v.split.my_other_bytes),
          others_bytes: num(v.split.others_bytes),
          unattributed_bytes: num(v.split.unattributed_bytes),
          free_bytes: num(v.split.free_bytes)
        }
      : null,
    mig_instances: Array.isArray(v.mig_instances) ? v.mig_instances.filter(isObject).map(migInstance) : null
  };
}

function migInstance(v: Json): IMigInstance {
  return {
    mig_index: int(v.mig_index),
    uuid: str(v.uuid),
    gpu_instance_id: int(v.gpu_instance_id),
    compute_instance_id: int(v.compute_instance_id),
    memory_used_bytes: num(v.memory_used_bytes),
    memory_total_bytes: num(v.memory_total_bytes),
    process_count: int(v.process_count),
    kernel_ids: Array.isArray(v.kernel_ids) ? strings(v.kernel_ids) : null,
    notes: strings(v.notes)
  };
}

function kernel(v: Json): IKernel | null {
  const id = str(v.id);
  if (!id) {
    return null;
  }
  const memory: Record<string, number | null> = {};
  if (isObject(v.gpu_memory_bytes)) {
    for (const [index, bytes] of Object.entries(v.gpu_memory_bytes)) {
      if (/^\d{1,4}$/.test(index)) {
        memory[index] = num(bytes);
      }
    }
  }
  return {
    id,
    name: str(v.name),
    path: str(v.path),
    session_name: str(v.session_name),
    session_type: str(v.session_type),
    execution_state: str(v.execution_state),
    last_activity: str(v.last_activity),
    pid: int(v.pid),
    child_pids: Array.isArray(v.child_pids) ? v.child_pids.map(int).filter((p): p is number => p !== null) : [],
    gpu_memory_bytes: memory,
    total_gpu_memory_bytes: num(v.total_gpu_memory_bytes),
    note: str(v.note),
    cull_due_at: str(v.cull_due_at)
  };
}

function processEntry(v: Json): IProcess | null {
  const gpuIndex = int(v.gpu);
  const pid = int(v.pid);
  if (gpuIndex === null || pid === null) {
    return null;
  }
  return {
    gpu: gpuIndex,
    pid,
    used_memory_bytes: num(v.used_memory_bytes),
    command: str(v.command),
    user: str(v.user),
    note: str(v.note)
  };
}

/** The entries `parse` accepts; one note per kind for those it could not read. */
function entries<T>(list: unknown, parse: (v: Json) => T | null, kind: string, notes: string[]): T[] {
  if (!Array.isArray(list)) {
    return [];
  }
  const parsed = list.map(v => (isObject(v) ? parse(v) : null));
  const kept = parsed.filter((v): v is T => v !== null);
  const dropped = list.length - kept.length;
  if (dropped) {
    notes.push(`${dropped} ${kind} entr${dropped === 1 ? 'y' : 'ies'} of the reply could not be read and ${dropped === 1 ? 'is' : 'are'} not shown.`);
  }
  return kept;
}

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function str(v: unknown): string | null {
  return typeof v === 'string' ? v : null;
}

function num(v: unknown): number | null {
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

function int(v: unknown): number | null {
  return typeof v === 'number' && Number.isSafeInteger(v) ? v : null;
}

function strings(v: unknown): string[] {
  return Array.isArray(v) ? v.filter((s): s is string => typeof s === 'string') : [];
}

function short(v: unknown): string {
  const text = typeof v === 'string' ? JSON.stringify(v) : String(v);
  return text.length > 40 ? `${text.slice(0, 40)}…` : text;
}
