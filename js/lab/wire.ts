// The %gpu monitor panel's binary messages (tfgpu_magic/kernel/widget.py batch_wire), read back
// into the columns the panel draws.  No runtime import: the panel's bundle (js/widget.ts) takes
// it in, and the tests run it alone in Node.
//
// A message of new samples of one layout carries its numbers in two buffers: the times
// (float64) and the readings as the kernel's history packs them (int64; -2**63 where a reading
// is missing), both little-endian.  Per sample, per device in the order of `packed.devices`,
// come the readings named by `packed.readings`, then one per framework figure the device charts.

/** A reading, or null where there is none (a gap in the chart). */
export type WireValue = number | null;

/** How a binary message's readings are laid out. */
export interface IPackedLayout {
  devices: [key: string, charted: [framework: string, series: string][]][];
  readings: string[]; // the fixed series, per device, in packed order ("total", "used", ...)
  wire: [framework: string, series: string, name: string][]; // a figure also sent under an older name ("tf")
}

export interface IWireDevice {
  [series: string]: unknown;
  frameworks?: Record<string, Record<string, WireValue[]>>;
}

const LOW_WORD = 4294967296; // 2**32
const GAP_HIGH = -0x80000000; // the high word of -2**63, the kernel's missing reading

/** int64s, little-endian, as numbers (exact to 2**53, beyond any byte count); the gap as null. */
export function readInt64s(view: DataView): WireValue[] {
  const n = Math.floor(view.byteLength / 8);
  const values = new Array<WireValue>(n);
  for (let i = 0; i < n; i++) {
    const low = view.getUint32(8 * i, true);
    const high = view.getInt32(8 * i + 4, true);
    values[i] = high === GAP_HIGH && low === 0 ? null : high * LOW_WORD + low;
  }
  return values;
}

/** float64s, little-endian. */
export function readFloat64s(view: DataView): number[] {
  const n = Math.floor(view.byteLength / 8);
  const values = new Array<number>(n);
  for (let i = 0; i < n; i++) values[i] = view.getFloat64(8 * i, true);
  return values;
}

/** A message as batch() would have sent it: its columns cut from the buffers when it has them.
 * A series with no column (TensorFlow's older "tf" without TensorFlow) is left out: the panel
 * reads a missing series as nulls. */
export function unpackSamples<T extends { packed?: IPackedLayout }>(msg: T, buffers: DataView[] | undefined): T {
  const packed = msg.packed;
  if (!packed || !buffers || buffers.length < 2) return msg;
  const t = readFloat64s(buffers[0]);
  const values = readInt64s(buffers[1]);
  const n = t.length;
  const stride = n ? values.length / n : 0;
  const column = (offset: number): WireValue[] => {
    const out = new Array<WireValue>(n);
    for (let i = 0; i < n; i++) out[i] = values[i * stride + offset];
    return out;
  };
  const older = new Map(packed.wire.map(([framework, series, name]) => [`${framework}\n${series}`, name]));
  const d: Record<string, IWireDevice> = {};
  let at = 0;
  for (const [key, charted] of packed.devices) {
    const device: IWireDevice = {};
    packed.readings.forEach((name, j) => (device[name] = column(at + j)));
    const frameworks: Record<string, Record<string, WireValue[]>> = {};
    charted.forEach(([framework, series], k) => {
      const values = column(at + packed.readings.length + k);
      (frameworks[framework] ||= {})[series] = values;
      const name = older.get(`${framework}\n${series}`);
      if (name) device[name] = values;
    });
    if (charted.length) device.frameworks = frameworks;
    d[key] = device;
    at += packed.readings.length + charted.length;
  }
  const unpacked: T = { ...msg, t, d };
  delete unpacked.packed;
  return unpacked;
}
