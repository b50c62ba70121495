/**
 * A tiny DOM builder that only ever sets text through `textContent`, so nothing
 * user-controlled (job names, owners, reasons, log lines) is parsed as HTML.
 */

export type Child = Node | string | null | undefined | false;

export interface IAttrs {
  className?: string;
  title?: string;
  data?: { [key: string]: string };
  style?: { [key: string]: string };
  attrs?: { [key: string]: string };
  onClick?: (event: MouseEvent) => void;
}

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  props: IAttrs = {},
  ...children: Child[]
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (props.className) {
    node.className = props.className;
  }
  if (props.title) {
    node.title = props.title;
  }
  for (const [key, value] of Object.entries(props.data ?? {})) {
    node.dataset[key] = value;
  }
  for (const [key, value] of Object.entries(props.style ?? {})) {
    node.style.setProperty(key, value);
  }
  for (const [key, value] of Object.entries(props.attrs ?? {})) {
    node.setAttribute(key, value);
  }
  const onClick = props.onClick;
  if (onClick) {
    node.addEventListener('click', event => onClick(event as MouseEvent));
  }
  append(node, children);
  return node;
}

export function append(node: Node, children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    node.appendChild(typeof child === 'string' ? document.createTextNode(child) : child);
  }
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** A sparkline of values in [0, max], drawn as an SVG polyline. */
export function sparkline(values: number[], max = 100, width = 80, height = 16): SVGSVGElement {
  const svg = document.createElementNS(SVG_NS, 'svg');
  svg.setAttribute('class', 'jp-dlsched-sparkline');
  svg.setAttribute('width', String(width));
  svg.setAttribute('height', String(height));
  svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
  svg.setAttribute('aria-hidden', 'true');
  if (values.length >= 2) {
    const step = width / (values.length - 1);
    const points = values
      .map((value, i) => {
        const v = Math.max(0, Math.min(max, Number(value) || 0));
        const x = (i * step).toFixed(1);
        const y = (height - 1 - (v / max) * (height - 2)).toFixed(1);
        return `${x},${y}`;
      })
      .join(' ');
    const line = document.createElementNS(SVG_NS, 'polyline');
    line.setAttribute('points', points);
    svg.appendChild(line);
  }
  return svg;
}

/** A horizontal bar filled to `fraction` (0..1). */
export function bar(fraction: number | null, className = ''): HTMLElement {
  const fill = h('span', {
    className: 'jp-dlsched-bar-fill',
    style: { width: `${Math.round(Math.max(0, Math.min(1, fraction ?? 0)) * 100)}%` }
  });
  return h('span', { className: `jp-dlsched-bar ${className}`.trim() }, fill);
}
