// The channel browser: searches the server's channels by name prefix (`GET /api/channels`,
// paged) as you type, and loads further pages on demand.

import type { Api, ChannelInfo } from './api.js';
import { h } from './dom.js';

/** Rows per page fetched from the server. */
const PAGE = 200;
/** Quiet time after typing before the server is asked. */
const DEBOUNCE_MS = 150;

export class ChannelBrowser {
  readonly el: HTMLElement;
  private readonly input: HTMLInputElement;
  private readonly list: HTMLElement;
  private readonly count: HTMLElement;
  private readonly more: HTMLButtonElement;
  private shown: ChannelInfo[] = [];
  private next: string | null = null;
  /** The prefix the rows shown belong to; answers for an older one are dropped. */
  private prefix = '';
  private loadedAt = 0;
  private timer: ReturnType<typeof setTimeout> | undefined;

  /** Called when a channel is picked. */
  onPick: (channel: string) => void = () => {};

  constructor(private readonly api: Api) {
    this.input = h('input', { type: 'search', placeholder: 'channel prefix, e.g. pt:', id: 'channel-search', autocomplete: 'off' });
    this.count = h('span', { className: 'dim' });
    const refresh = h('button', { type: 'button', title: 'reload the channel list', textContent: '↻' });
    this.list = h('ul', { className: 'channel-list', id: 'channel-list' });
    this.more = h('button', { type: 'button', id: 'channel-more', textContent: 'load more' });
    this.more.hidden = true;
    this.el = h('section', { className: 'panel-section' }, [
      h('h2', { textContent: 'Channels ' }, [this.count]),
      h('div', { className: 'row' }, [this.input, refresh]),
      this.list,
      this.more,
    ]);
    this.input.addEventListener('input', () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => void this.load(), DEBOUNCE_MS);
    });
    this.input.addEventListener('focus', () => {
      if (Date.now() - this.loadedAt > 5000) void this.load();
    });
    refresh.addEventListener('click', () => void this.load());
    this.more.addEventListener('click', () => void this.loadMore());
    this.list.addEventListener('click', (e) => {
      const li = (e.target as HTMLElement).closest('li[data-channel]') as HTMLElement | null;
      if (li) this.onPick(li.dataset.channel!);
    });
  }

  /** The first page of channels starting with what is typed. */
  async load(): Promise<void> {
    const prefix = this.input.value.trim();
    this.prefix = prefix;
    try {
      const page = await this.api.channels(prefix, PAGE);
      if (prefix !== this.prefix) return;
      this.shown = page.channels;
      this.next = page.next;
      this.loadedAt = Date.now();
    } catch (e) {
      this.count.textContent = `(${(e as Error).message})`;
      return;
    }
    this.show();
  }

  private async loadMore(): Promise<void> {
    if (!this.next) return;
    const prefix = this.prefix;
    try {
      const page = await this.api.channels(prefix, PAGE, this.next);
      if (prefix !== this.prefix) return;
      this.shown = this.shown.concat(page.channels);
      this.next = page.next;
    } catch (e) {
      this.count.textContent = `(${(e as Error).message})`;
      return;
    }
    this.show();
  }

  /** Channel names loaded so far, for autocompletion. */
  names(): string[] {
    return this.shown.map((c) => c.channel);
  }

  private show(): void {
    this.count.textContent = `(${this.shown.length}${this.next ? '+' : ''})`;
    const rows = this.shown.map((c) => {
      const li = h('li', { title: `offset ${c.offset}, ${c.subscribers} subscribers` }, [
        h('span', { className: 'ch', textContent: c.channel }),
        h('span', { className: 'dim', textContent: String(c.offset) }),
      ]);
      li.dataset.channel = c.channel;
      return li;
    });
    this.list.replaceChildren(...rows);
    this.more.hidden = this.next === null;
  }
}
