// `%gpu save` writes into the open notebook: the kernel displays the metadata keys to set under
// METADATA_MIME (with a text/plain line for people), and this module writes them into the
// notebook's model, so the user's next save keeps them.  Nothing writes the file behind the
// editor's back: the model is the editor's own, and it shows the notebook as changed.
//
// Only type imports: the compiled module runs on its own in Node (tests/test_lab_settings.py
// compares mergeMetadata with tfgpu_magic.command.saved.merge_metadata).

import type { NotebookPanel } from '@jupyterlab/notebook';
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
 * so anything else is ignored, and so are the keys `%gpu save` never writes.
 */
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
  return kept;
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
export function writeIntoModel(panel: NotebookPanel, update: JsonObject): void {
  const model = panel.content.model;
  if (!model) {
    return;
  }
  for (const [key, value] of Object.entries(update)) {
    model.setMetadata(key, mergedValue(key, model.getMetadata(key), value));
  }
}

/** Follow a notebook's kernel (whichever it has now, restarts and changes included). */
export function followNotebook(panel: NotebookPanel): void {
  panel.sessionContext.iopubMessage.connect((_, message) => {
    const update = updateFromMessage(message);
    if (update) {
      writeIntoModel(panel, update);
    }
  });
}
