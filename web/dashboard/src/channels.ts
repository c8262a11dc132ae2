// The channel browser: searches the server's channels (`GET /api/channels`) as you type.

import type { Api, ChannelInfo } from './api.js';
import { h } from './dom.js';

/** Most rows shown at once; the search narrows the rest. */
const SHOWN = 200;

export class ChannelBrowser {
  readonly el: HTMLElement;
  private readonly input: HTMLInputElement;
  private readonly list: HTMLElement;
  private readonly count: HTMLElement;
  private all: ChannelInfo[] = [];
  private loadedAt = 0;

  /** Called when a channel is picked. */
  onPick: (channel: string) => void = () => {};

  constructor(private readonly api: Api) {
    this.input = h('input', { type: 'search', placeholder: 'search channels', id: 'channel-search', autocomplete: 'off' });
    this.count = h('span', { className: 'dim' });
    const refresh = h('button', { type: 'button', title: 'reload the channel list', textContent: '↻' });
    this.list = h('ul', { className: 'channel-list', id: 'channel-list' });
    this.el = h('section', { className: 'panel-section' }, [
      h('h2', { textContent: 'Channels ' }, [this.count]),
      h('div', { className: 'row' }, [this.input, refresh]),
      this.list,
    ]);
    this.input.addEventListener('input', () => this.show());
    this.input.addEventListener('focus', () => {
      if (Date.now() - this.loadedAt > 5000) void this.load();
    });
    refresh.addEventListener('click', () => void this.load());
    this.list.addEventListener('click', (e) => {
      const li = (e.target as HTMLElement).closest('li[data-channel]') as HTMLElement | null;
      if (li) this.onPick(li.dataset.channel!);
    });
  }

  async load(): Promise<void> {
    try {
      this.all = await this.api.channels();
      this.loadedAt = Date.now();
    } catch (e) {
      this.count.textContent = `(${(e as Error).message})`;
      return;
    }
    this.show();
  }

  /** Channel names for autocompletion. */
  names(): string[] {
    return this.all.map((c) => c.channel);
  }

  private show(): void {
    const q = this.input.value.trim().toLowerCase();
    const hits = q ? this.all.filter((c) => c.channel.toLowerCase().includes(q)) : this.all;
    this.count.textContent = `(${hits.length} of ${this.all.length})`;
    const rows = hits.slice(0, SHOWN).map((c) =>
      h('li', { title: `offset ${c.offset}, ${c.subscribers} subscribers` }, [
        h('span', { className: 'ch', textContent: c.channel }),
        h('span', { className: 'dim', textContent: String(c.offset) }),
      ]),
    );
    rows.forEach((li, i) => (li.dataset.channel = hits[i].channel));
    this.list.replaceChildren(...rows);
  }
}
