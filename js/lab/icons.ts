// The side-bar icon: a graphics card (board, fan, chip, bracket).  `jp-icon3` makes JupyterLab
// recolour it with the theme, like its own icons.

import { LabIcon } from '@jupyterlab/ui-components';

const GPU_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M1 5h2v1h18a2 2 0 0 1 2 2v9a2 2 0 0 1-2 2h-9v2h-2v-2H5v2H3V5zm2 3v9h18V8z"/>
    <path d="M9 8.6a3.9 3.9 0 1 0 0 7.8 3.9 3.9 0 0 0 0-7.8zm0 1.8a2.1 2.1 0 1 1 0 4.2 2.1 2.1 0 0 1 0-4.2z"/>
    <circle cx="9" cy="12.5" r="0.9"/>
    <rect x="14.5" y="10" width="5" height="5" rx="0.6"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({ name: 'tfgpu-magic:gpu', svgstr: GPU_SVG });
