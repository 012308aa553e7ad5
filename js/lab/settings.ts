// A notebook's saved GPU settings (metadata `tfgpu`) in the page.
//
// `%gpu save` writes into the open notebook: the kernel displays the metadata keys to set under
// METADATA_MIME (with a text/plain line for people), and this module writes them into the
// notebook's model, so the user's next save keeps them.  Nothing writes the file behind the
// editor's back: the model is the editor's own, and it shows the notebook as changed.
//
// As a notebook with settings opens (its kernel started with them applied, by the server), the
// page asks the kernel whether they held, and warns the user at once when they did not, rather
// than under the first cell the user runs.
//
// Only type imports: the compiled module runs on its own in Node (tests/test_lab_settings.py
// compares mergeMetadata with tfgpu_magic.command.saved.merge_metadata).

import type { INotebookModel, NotebookPanel } from '@jupyterlab/notebook';
import type { KernelMessage } from '@jupyterlab/services';

/** tfgpu_magic.command.saved.MIME_TYPE: what `%gpu save` displays. */
export const METADATA_MIME = 'application/vnd.tfgpu.notebook-metadata+json';
/** tfgpu_magic.command.saved.KEY: the notebook's GPU settings, replaced whole. */
export const SETTINGS_KEY = 'tfgpu';
/** The keys `%gpu save` writes (its own, then Colab's and Kaggle's); a kernel's others are ignored. */
export const WRITTEN_KEYS: readonly string[] = [SETTINGS_KEY, 'accelerator', 'colab', 'kaggle'];
// The output messages that carry a display bundle.
const OUTPUT_MESSAGES: readonly string[] = ['display_data', 'execute_result', 'update_display_data'];

export type JsonObject = { [key: string]: unknown };

export function isObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * The value `key` takes when `value` is written over `old`: the settings key replaced whole;
 * another key whose old and new values are both objects (colab, kaggle) merged one level, so
 * the keys others wrote there stay; any other value replaced.  saved.merge_metadata's rule.
 */
export function mergedValue(key: string, old: unknown, value: unknown): unknown {
  if (key !== SETTINGS_KEY && isObject(old) && isObject(value)) {
    return { ...old, ...value };
  }
  return value;
}

function ownValue(object: JsonObject, key: string): unknown {
  return Object.prototype.hasOwnProperty.call(object, key) ? object[key] : undefined;
}

/** `metadata` with `update`'s keys written in (mergedValue's rule); neither is changed. */
export function mergeMetadata(metadata: JsonObject, update: JsonObject): JsonObject {
  const merged: JsonObject = { ...metadata };
  for (const [key, value] of Object.entries(update)) {
    // defineProperty: a key named "__proto__" is a key like any other, as in Python.
    Object.defineProperty(merged, key, {
      value: mergedValue(key, ownValue(merged, key), value),
      enumerable: true,
      writable: true,
      configurable: true
    });
  }
  return merged;
}

/**
 * The metadata keys a display bundle asks to set, or null when it asks none: an object under
 * METADATA_MIME whose `tfgpu` is an object with a whole-number version.  It comes from a kernel,
 * so anything else is ignored, and so are the keys `%gpu save` never writes, and an update larger
 * than MAX_UPDATE_CHARS (it would weigh down the notebook the user saves).
 */
// The most a kept update may weigh, as JSON: `%gpu save` writes a few KiB (its `observed` is
// refused by the reader past 64 KiB), so anything near this is not its output.
export const MAX_UPDATE_CHARS = 128 * 1024;

export function readUpdate(data: unknown): JsonObject | null {
  if (!isObject(data)) {
    return null;
  }
  const update = data[METADATA_MIME];
  if (!isObject(update)) {
    return null;
  }
  const settings = update[SETTINGS_KEY];
  if (!isObject(settings) || !Number.isInteger(settings.version)) {
    return null;
  }
  const kept: JsonObject = {};
  for (const key of WRITTEN_KEYS) {
    if (Object.prototype.hasOwnProperty.call(update, key)) {
      kept[key] = update[key];
    }
  }
  return JSON.stringify(kept).length <= MAX_UPDATE_CHARS ? kept : null;
}

/** The update an IOPub message carries (see readUpdate), or null. */
export function updateFromMessage(message: KernelMessage.IMessage): JsonObject | null {
  if (!OUTPUT_MESSAGES.includes(message.header.msg_type)) {
    return null;
  }
  const content: unknown = message.content;
  return isObject(content) ? readUpdate(content.data) : null;
}

/** Write `update` into the notebook's model, key by key (the model marks itself changed). */
export function writeIntoModel(model: INotebookModel, update: JsonObject): void {
  for (const [key, value] of Object.entries(update)) {
    model.setMetadata(key, mergedValue(key, model.getMetadata(key), value));
  }
}

// What the page asks a notebook's kernel as it starts, when the notebook has saved settings:
// tfgpu_magic.kernel.notebook_settings.start_notice(), a JSON {"notice": line or null}.  Silent: no
// execution count, no output, no history.  Looked up, never imported: a kernel that applied no
// settings (started before the key was saved) answers None and gets nothing of tfgpu_magic.
const NOTICE_EXPRESSION =
  "getattr(__import__('sys').modules.get('tfgpu_magic.kernel.notebook_settings'), 'start_notice', lambda: None)()";

/** The execute request that asks it (kernel.requestExecute's content). */
export function noticeRequest(): KernelMessage.IExecuteRequestMsg['content'] {
  return {
    code: '',
    silent: true,
    store_history: false,
    user_expressions: { tfgpu: NOTICE_EXPRESSION },
    allow_stdin: false
  };
}

/** The notice in the kernel's reply (the line to show), or null: none, or a reply it cannot be read from. */
export function readNotice(content: unknown): string | null {
  if (!isObject(content) || !isObject(content.user_expressions)) {
    return null;
  }
  const answer = content.user_expressions.tfgpu;
  if (!isObject(answer) || answer.status !== 'ok' || !isObject(answer.data)) {
    return null;
  }
  const json = answer.data['application/json'];
  return isObject(json) && typeof json.notice === 'string' && json.notice ? json.notice : null;
}

// JupyterLab cuts a notification's message at 140 characters (its toast and its list alike).
export const NOTIFICATION_CHARS = 140;
const HEADLINE = "tfgpu_magic: this notebook's saved GPU settings did not all hold as its kernel started";

/** What the notification says: the kernel's line when it fits, else a headline and the line as details. */
export function noticeMessage(line: string): { message: string; details: string | null } {
  if (line.length <= NOTIFICATION_CHARS) {
    return { message: line, details: null };
  }
  return { message: HEADLINE, details: line };
}

type NotebookContext = NotebookPanel['context'];
const followed = new WeakSet<NotebookContext>(); // the notebooks followNotebook follows

/** Ask the notebook's kernel whether its saved settings held at its start; `warn` shows the line. */
async function askForNotice(notebook: NotebookContext, warn: (line: string) => void): Promise<void> {
  const kernel = notebook.sessionContext.session?.kernel;
  if (!kernel || !isObject(notebook.model.getMetadata(SETTINGS_KEY))) {
    return; // no settings: nothing was applied, nothing to say
  }
  const reply = await kernel.requestExecute(noticeRequest(), true).done;
  const notice = readNotice(reply.content);
  if (notice) {
    warn(notice);
  }
}

/**
 * Follow a notebook's kernel (whichever it has now, restarts and changes included): write what
 * `%gpu save` displays into the notebook, and once the kernel is up after each start, ask whether
 * the notebook's saved settings held (`warn` shows the kernel's line when they did not).
 */
export function followNotebook(panel: NotebookPanel, warn: (line: string) => void): void {
  // Views of one notebook (New View for Notebook) share its context: it is followed once.
  const notebook = panel.context;
  if (followed.has(notebook)) {
    return;
  }
  followed.add(notebook);
  const session = notebook.sessionContext;
  session.iopubMessage.connect((_, message) => {
    const update = updateFromMessage(message);
    if (update) {
      writeIntoModel(notebook.model, update);
    }
  });
  let due = true; // a kernel started that has not been asked yet
  session.kernelChanged.connect(() => {
    due = true;
  });
  session.statusChanged.connect((_, status) => {
    if (status === 'starting' || status === 'restarting' || status === 'autorestarting') {
      due = true;
    } else if (status === 'idle' && due) {
      due = false;
      askForNotice(notebook, warn).catch(() => undefined); // a kernel gone meanwhile: nothing to say
    }
  });
}
